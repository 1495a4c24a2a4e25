"""Topic subscriptions for tests/test_topic_window.py's --burst workers: each handled
message writes a GateRun row (label and seq from the payload, key ``<group>:``)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from django_mysqlq import Topic, TopicEvent

from .models import GateRun

windowfeed = Topic("windowfeed")


def _record(group: str, event: TopicEvent, outcome: str) -> None:
    data: dict[str, Any] = event.payload
    GateRun.objects.create(label=data["label"], key=f"{group}:", seq=data["seq"], edge="end",
                           outcome=outcome, at=time.time(), pid=os.getpid(),
                           thread=threading.current_thread().name)


@windowfeed.subscribe(group="heldwin", on_dead="hold", max_attempts=1)
def held(event: TopicEvent) -> None:
    """Fails (dead at once, its key held) where the payload says ``fail``."""
    if event.payload.get("fail"):
        _record("heldwin", event, "failed")
        raise RuntimeError(f"heldwin failed on #{event.payload['seq']}")
    _record("heldwin", event, "ok")


@windowfeed.subscribe(group="laterwin", retry_backoff=[3600], max_attempts=5)
def later(event: TopicEvent) -> None:
    """Always fails: its retry comes in an hour."""
    _record("laterwin", event, "failed")
    raise RuntimeError(f"laterwin failed on #{event.payload['seq']}")


@windowfeed.subscribe(group="somewin", retry_backoff=[3600], max_attempts=5)
def some(event: TopicEvent) -> None:
    """Fails (a retry in an hour) where the payload says ``fail``, else works."""
    if event.payload.get("fail"):
        _record("somewin", event, "failed")
        raise RuntimeError(f"somewin failed on #{event.payload['seq']}")
    _record("somewin", event, "ok")
