"""Test rig: tasks that end exactly as their worker acts on their timeout.

Loaded by a worker subprocess through ``MYSQLQ_TEST_EXTRA_TASK_MODULES``
(tests/test_timeout_races.py). Each task waits, past its timeout, until the worker's
control thread acts on the overrun, then ends, while the control thread waits a moment,
so that the task's end lands where the test wants it:

* ``at_overrun``: as ``task_overran`` is sent, before the worker fails the attempt (the
  receiver waits while the task ends and its ack, if any, is written or handed over);
* ``after_fail``: once the worker has failed the attempt for its timeout and logged its
  line, before it goes on to exit (a filter on the ``django_mysqlq.attempts`` logger).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django_mysqlq import queue_task
from django_mysqlq.signals import task_overran

TIMEOUT = 0.3
#: How long the control thread waits for the task's end to land.
SETTLE_SECONDS = 0.5

_go = threading.Event()
_mode = {"now": ""}


def _wait_for_the_overrun(mode: str) -> None:
    _go.clear()
    _mode["now"] = mode
    if not _go.wait(30):
        raise RuntimeError("the worker never acted on the overrun")


@queue_task(timeout=TIMEOUT, max_attempts=2, retry_backoff=0)
def ends_at_overrun(mode: str, raises: bool = False) -> str:
    _wait_for_the_overrun(mode)
    if raises:
        raise RuntimeError("ended as it overran")
    return "done"


@queue_task(timeout=TIMEOUT, max_attempts=2, retry_backoff=0, atomic=True)
def atomic_ends_at_overrun(mode: str) -> str:
    _wait_for_the_overrun(mode)
    return "done"


def _release(mode: str) -> None:
    if _mode["now"] == mode:
        _mode["now"] = ""
        _go.set()
        time.sleep(SETTLE_SECONDS)


def _at_overrun(**kwargs: Any) -> None:
    _release("at_overrun")


def _after_fail(record: logging.LogRecord) -> bool:
    if getattr(record, "error_class", "") == "django_mysqlq.exceptions.TaskTimeout":
        _release("after_fail")
    return True


task_overran.connect(_at_overrun, weak=False, dispatch_uid="overrun_tasks")
logging.getLogger("django_mysqlq.attempts").addFilter(_after_fail)
