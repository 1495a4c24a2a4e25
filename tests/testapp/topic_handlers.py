"""Topic subscriptions for tests/test_topics*.py. Each handled message writes a
:class:`GateRun` row (label and seq from the payload, key ``<group>:<message key>``), from
which the ledger proves each group handled each message, in key order. Broadcast runs are
written under ``<label>/broadcast``, one ``end`` row per process and message."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

from django_mysqlq import Topic, TopicEvent

from .models import GateRun

ledger = Topic("ledger")
#: Fast retries for the tests (the default schedule starts at 10 s).
FAST = [0.05, 0.1, 0.2]


def _edge(event: TopicEvent, who: str, edge: str, outcome: str = "") -> None:
    data: dict[str, Any] = event.payload
    GateRun.objects.create(label=data["label"], key=f"{who}:{event.key or ''}",
                           seq=data["seq"], edge=edge, outcome=outcome, at=time.time(),
                           pid=os.getpid(), thread=threading.current_thread().name)


def _handle(group: str, event: TopicEvent) -> None:
    data: dict[str, Any] = event.payload
    _edge(event, group, "start")
    time.sleep(data.get("sleep_ms", 0) / 1000)
    flaky = group in data.get("flaky", (group,))  # the groups random failures hit
    if group in data.get("always_fail", ()) or (
            flaky and random.random() < data.get("fail_rate", 0)):
        _edge(event, group, "end", "failed")
        raise RuntimeError(f"{group} failed on #{data['seq']}")
    _edge(event, group, "end", "ok")


@ledger.subscribe(group="billing", retry_backoff=FAST, max_attempts=40)
def bill(event: TopicEvent) -> None:
    _handle("billing", event)


@ledger.subscribe(group="audit", retry_backoff=FAST, max_attempts=40, on_dead="hold")
def audit(event: TopicEvent) -> None:
    _handle("audit", event)


@ledger.subscribe(group="broken", retry_backoff=[0.05], max_attempts=3)
def broken(event: TopicEvent) -> None:
    _handle("broken", event)


@ledger.subscribe(broadcast=True)
def everywhere(event: TopicEvent) -> None:
    data: dict[str, Any] = event.payload
    GateRun.objects.create(label=f"{data['label']}/broadcast", key=f"broadcast:{os.getpid()}",
                           seq=data["seq"], edge="end", outcome="ok", at=time.time(),
                           pid=os.getpid(), thread=threading.current_thread().name)
