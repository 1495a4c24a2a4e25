"""A broadcast subscription whose handler takes ``payload["sleep"]`` seconds, for
tests/test_broadcast_stop.py. Each run writes a :class:`GateRun` row at its start and at
its end: label ``slowcast``, seq from the payload."""

from __future__ import annotations

import os
import threading
import time

from django_mysqlq import Topic, TopicEvent

from .models import GateRun

slowcast = Topic("slowcast")


def _edge(event: TopicEvent, edge: str) -> None:
    GateRun.objects.create(label="slowcast", key=f"broadcast:{os.getpid()}",
                           seq=event.payload["seq"], edge=edge, outcome="ok", at=time.time(),
                           pid=os.getpid(), thread=threading.current_thread().name)


@slowcast.subscribe(broadcast=True)
def on_slowcast(event: TopicEvent) -> None:
    _edge(event, "start")
    time.sleep(event.payload["sleep"])
    _edge(event, "end")
