"""Broadcast subscriptions of two topics for tests/test_topics_workers.py. ``wedged`` is
subscribed first, so a worker's broadcast reader reads it first in each poll (in the order
of the subscriptions). Each handled message writes a :class:`GateRun` row: label
``<topic>/broadcast``, key ``broadcast:<pid>``, seq from the payload."""

from __future__ import annotations

import os
import threading
import time

from django_mysqlq import Topic, TopicEvent

from .models import GateRun

wedged = Topic("wedged")
flowing = Topic("flowing")


def _heard(event: TopicEvent) -> None:
    GateRun.objects.create(label=f"{event.topic}/broadcast", key=f"broadcast:{os.getpid()}",
                           seq=event.payload["seq"], edge="end", outcome="ok", at=time.time(),
                           pid=os.getpid(), thread=threading.current_thread().name)


@wedged.subscribe(broadcast=True)
def on_wedged(event: TopicEvent) -> None:
    _heard(event)


@flowing.subscribe(broadcast=True)
def on_flowing(event: TopicEvent) -> None:
    _heard(event)
