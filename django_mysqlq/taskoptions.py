"""Checks of a task's and a call's options that raise ``InvalidTaskOptions``: the
sentences come from ``limits``; ``@queue_task`` and ``.using()`` share them."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from . import limits
from .exceptions import InvalidTaskOptions
from .limits import DEDUP_KEY_MAX


def checked(problem: str | None) -> None:
    if problem is not None:
        raise InvalidTaskOptions(problem)


def validate_queue(queue: object) -> str:
    checked(limits.queue_problem(queue))
    assert isinstance(queue, str)
    return queue


def validate_priority(priority: object) -> int:
    checked(limits.priority_problem(priority))
    assert isinstance(priority, int)
    return priority


def validate_delay(delay: object) -> float:
    checked(limits.delay_problem(delay))
    assert isinstance(delay, dt.timedelta | int | float)
    return delay.total_seconds() if isinstance(delay, dt.timedelta) else float(delay)


def validate_run_at(run_at: object) -> dt.datetime:
    checked(limits.run_at_problem(run_at, timezone.now()))
    assert isinstance(run_at, dt.datetime)
    return run_at


def validate_dedup_key(key: object) -> str:
    if (not isinstance(key, str) or not key or len(key) > DEDUP_KEY_MAX
            or not limits.is_utf8(key)):
        raise InvalidTaskOptions(
            f"dedup_key must be a non-empty string of at most {DEDUP_KEY_MAX} characters "
            f"in valid UTF-8 (no lone surrogates), not {key!r}."
        )
    return key
