"""Test rig: a task that kills its process at every run, and an innocent beside it on
their own queue (tests/test_solo_acks.py).

Loaded by a worker subprocess through ``MYSQLQ_TEST_EXTRA_TASK_MODULES``, so that the
queue ``crash2`` is known only to the workers of those tests (a plain worker serves every
queue its tasks use: tests/test_unserved_queues.py counts them).
"""

from __future__ import annotations

import os

from django_mysqlq import queue_task
from tests.testapp.models import Ledger


@queue_task(queue="crash2", max_attempts=3, retry_backoff=0)
def crash3() -> None:
    """Kills its process at every run: a repeat offender (tests/test_solo_acks.py)."""
    Ledger.objects.create(label="crash3:start", pid=os.getpid())
    os._exit(1)


@queue_task(queue="crash2", max_attempts=3, retry_backoff=0)
def innocent(i: int) -> int:
    """Queued beside ``crash3``: it must never be charged for the offender's repeat crashes."""
    Ledger.objects.create(label=f"inn:{i}", pid=os.getpid())
    return i
