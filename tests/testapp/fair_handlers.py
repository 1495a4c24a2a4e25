"""Two groups of one topic for tests/test_topic_group_turns.py: ``aaa`` (a slow handler,
claimed first in name order) and ``zzz`` (a fast one). Each handled message writes a
:class:`GateRun` row: label ``fair/<group>``, seq from the payload, ``at`` its end."""

from __future__ import annotations

import os
import threading
import time

from django_mysqlq import Topic, TopicEvent

from .models import GateRun

fair = Topic("fair")
#: How long the slow group's handler takes per message (long beside the fast group's, even
#: on a loaded machine where the fast one takes tens of milliseconds).
SLOW_SECONDS = 0.4


def _done(group: str, event: TopicEvent) -> None:
    GateRun.objects.create(label=f"fair/{group}", key=group, seq=event.payload["seq"],
                           edge="end", outcome="ok", at=time.time(), pid=os.getpid(),
                           thread=threading.current_thread().name)


@fair.subscribe(group="aaa")
def slow(event: TopicEvent) -> None:
    time.sleep(SLOW_SECONDS)
    _done("aaa", event)


@fair.subscribe(group="zzz")
def fast(event: TopicEvent) -> None:
    _done("zzz", event)
