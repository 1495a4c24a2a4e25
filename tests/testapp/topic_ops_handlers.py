"""Topic subscriptions for tests/test_topic_ops_workers.py (the operators' tests): each
handled message writes a GateRun row (label, seq from the payload; key ``<group>:``),
and the ``topic_handler_overran`` alert writes one with edge ``alert``."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from django.dispatch import receiver

from django_mysqlq import Topic, TopicEvent
from django_mysqlq.signals import topic_handler_overran

from .models import GateRun
from .tasks import wait_for_gate

feed = Topic("opsfeed")


def _record(group: str, event: TopicEvent, edge: str) -> None:
    data: dict[str, Any] = event.payload
    GateRun.objects.create(label=data["label"], key=f"{group}:", seq=data["seq"], edge=edge,
                           outcome="ok", at=time.time(), pid=os.getpid(),
                           thread=threading.current_thread().name)


@feed.subscribe(group="ops", retry_backoff=[0.05], max_attempts=5)
def handle(event: TopicEvent) -> None:
    _record("ops", event, "start")
    time.sleep(event.payload.get("sleep_ms", 0) / 1000)
    _record("ops", event, "end")


@feed.subscribe(group="slowops", timeout=0.3, max_attempts=1)
def slow(event: TopicEvent) -> None:
    """Sleeps ``slow_ms``, or less if the file ``gate`` in the payload appears first."""
    seconds = event.payload.get("slow_ms", 0) / 1000
    if event.payload.get("gate"):
        wait_for_gate(event.payload["gate"], seconds)
    else:
        time.sleep(seconds)
    _record("slowops", event, "end")


@receiver(topic_handler_overran)
def _alerted(sender: str, *, group: str, offset: int | None, **kwargs: Any) -> None:
    GateRun.objects.create(label=f"alert:{sender}", key=f"{group}:", seq=offset or 0,
                           edge="alert", outcome="", at=time.time(), pid=os.getpid(),
                           thread=threading.current_thread().name)
