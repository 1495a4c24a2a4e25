"""Test rig: signal receivers that end with a BaseException, not an Exception.

Loaded by tests/settings.py in a worker subprocess when ``MYSQLQ_TEST_EXITING_RECEIVERS``
is set (tests/test_signal_receivers.py). Each receiver calls ``sys.exit()`` or raises a
BaseException subclass of the project's own: a receiver's failure must be logged and
break nothing, whatever it raises.
"""

from __future__ import annotations

import sys
from typing import Any


class ReceiverBailedOut(BaseException):
    """What a receiver might raise to "abort": not an Exception."""


def _exits(**kwargs: Any) -> None:
    sys.exit(3)


def _bails_out(**kwargs: Any) -> None:
    raise ReceiverBailedOut("a receiver bailed out")


def install() -> None:
    """Connect the receivers to the queue's signals and, if present, Django's task ones."""
    from django_mysqlq import signals

    signals.task_started.connect(_exits, weak=False)
    signals.task_finished.connect(_bails_out, weak=False)
    try:
        from django_mysqlq.backend.compat import task_finished, task_started
    except ImportError:
        return
    task_started.connect(_bails_out, weak=False)
    task_finished.connect(_exits, weak=False)
