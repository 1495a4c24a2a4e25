"""The chaos run's tasks; workers import them by autodiscovery.

The queue doesn't tell a task its message id, so the ``task_started`` signal (sent on
the task's thread just before it runs) leaves it in a thread-local for the ledger.
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.dispatch import receiver

from django_mysqlq import queue_task
from django_mysqlq.signals import task_started

from ..config import GATE_LIMIT, RATE_LIMIT, RATE_WINDOW_SECONDS
from . import record, stream  # noqa: F401  (stream: the topic's subscriptions)
from .models import Effect, Kind


@receiver(task_started, dispatch_uid="bench.chaos.ledger.remember")
def _remember(sender: Any, *, message_id: int, attempt: int, **kwargs: Any) -> None:
    record.remember(message_id, attempt)


@queue_task(name="chaos.plain")
def plain(token: str, sleep_ms: int) -> None:
    """Record the start, sleep, record the end."""
    run = record.start(token, Kind.PLAIN)
    time.sleep(sleep_ms / 1000)
    record.end(run)


@queue_task(name="chaos.atomic", atomic=True)
def atomic(token: str, sleep_ms: int) -> None:
    """Write one business row; it must commit exactly once, with the ack."""
    run = record.start(token, Kind.ATOMIC)
    Effect.objects.create(token=token, message_id=run.message_id, pid=os.getpid(),
                          at=time.time())
    time.sleep(sleep_ms / 1000)
    record.end(run)


@queue_task(name="chaos.ordered", ordered_by="subject", max_attempts=10, retry_backoff=0.1)
def ordered(token: str, subject: str, sleep_ms: int) -> None:
    """Like ``plain``, one at a time per subject in enqueue order (audited: ordering.py).
    Ten attempts: kill -9s spend them, and a dead head would hold its subject."""
    run = record.start(token, Kind.ORDERED)
    time.sleep(sleep_ms / 1000)
    record.end(run)


@queue_task(name="chaos.limited", concurrency_key="key", concurrency_limit=GATE_LIMIT,
            max_attempts=10, retry_backoff=0.1)
def limited(token: str, key: str, sleep_ms: int) -> None:
    """Like ``plain``, at most ``GATE_LIMIT`` at once per key (audited: ordering.py)."""
    run = record.start(token, Kind.LIMITED)
    time.sleep(sleep_ms / 1000)
    record.end(run)


@queue_task(name="chaos.rated", rate_limit=f"{RATE_LIMIT}/{RATE_WINDOW_SECONDS}s",
            rate_limit_key="key", max_attempts=10, retry_backoff=0.1)
def rated(token: str, key: str, sleep_ms: int) -> None:
    """Like ``plain``, at most ``RATE_LIMIT`` starts per window per key across all workers
    (audited: ordering.py)."""
    run = record.start(token, Kind.RATED)
    time.sleep(sleep_ms / 1000)
    record.end(run)


@queue_task(name="chaos.crash", max_attempts=2, retry_backoff=0)
def crash(token: str) -> None:
    """Record the start, then take the whole worker process down (an OOM kill, a segfault).

    Each run costs its worker; with crash isolation only this message pays for it, and
    after its two attempts it is dead."""
    record.start(token, Kind.CRASH)
    os._exit(1)
