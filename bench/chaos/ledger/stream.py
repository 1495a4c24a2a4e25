"""The chaos run's topic: three consumer groups and one broadcast subscription.

Every handler writes ledger rows on a connection of its own (``ledger``), so the audit
(``bench/chaos/topics_audit.py``) can prove each group handled each committed message,
in key order, and each live worker process heard it. The groups fail at random on
purpose, with fast retries (``audit`` fails the most); a failed run is written as such,
so it never counts as a duplicate. The groups start at the ``earliest`` message: the
producers may publish before the last member created the group's row.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from typing import Any

from django_mysqlq import Topic, TopicEvent

from . import record
from .models import Edge, Handled, Heard

TOPIC = Topic("chaos")
#: Each group's chance of failing one run on purpose.
FAILURE_RATES = {"billing": 0.05, "shipping": 0.1, "audit": 0.3}
#: Retries come fast; attempts are many, so a delivery never dies of failures and chaos
#: together (0.3 ** 40), and a dead delivery stays a finding.
RETRY_BACKOFF = (0.05, 0.1, 0.2, 0.5)
MAX_ATTEMPTS = 40


class Failed(RuntimeError):
    """A failure drawn on purpose."""


def _row(event: TopicEvent, run: str, edge: str, outcome: str = "") -> Handled:
    message_id, attempt = record.current()
    return Handled(run=run, edge=edge, outcome=outcome, token=event.payload["token"],
                   group=event.group or "", offset=event.offset, message_id=message_id,
                   attempt=attempt, pid=os.getpid(), at=time.time())


def _handle(event: TopicEvent) -> None:
    group = event.group or ""
    run = uuid.uuid4().hex
    record.write(_row(event, run, Edge.START))
    data: dict[str, Any] = event.payload
    time.sleep(data.get("sleep_ms", 0) / 1000)
    if random.random() < FAILURE_RATES[group]:
        record.write(_row(event, run, Edge.END, "failed"))
        raise Failed(f"{group} failed on offset {event.offset} on purpose")
    record.write(_row(event, run, Edge.END, "ok"))


def _subscribe(group: str) -> None:
    TOPIC.subscribe(group=group, start="earliest", retry_backoff=RETRY_BACKOFF,
                    max_attempts=MAX_ATTEMPTS)(_handle)


for _group in FAILURE_RATES:
    _subscribe(_group)


@TOPIC.subscribe(broadcast=True)
def heard(event: TopicEvent) -> None:
    """Every live worker process: one row per message."""
    record.write(Heard(run=uuid.uuid4().hex, token=event.payload["token"],
                       offset=event.offset, pid=os.getpid(), at=time.time()))
