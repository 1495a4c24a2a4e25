"""Retry control a task declares, and what a failed attempt's end should be.

``@queue_task(retry_on=..., dont_retry=..., retry_backoff=[...])`` is checked here when the
task is declared; :func:`decide` is asked by the worker when an attempt raised. Imports
nothing of the package but ``limits`` and ``exceptions``.

* ``dont_retry``: these exceptions (and their subclasses) make the message dead at once.
* ``retry_on``: only these retry; any other makes the message dead at once. Given both,
  ``dont_retry`` wins: ``retry_on=(OSError,), dont_retry=(FileNotFoundError,)`` retries
  every ``OSError`` but a missing file.
* :class:`~django_mysqlq.Retry` raised by the task always retries (while attempts are
  left), after the delay it asks for.
* A list of delays as ``retry_backoff``: the n-th retry waits the n-th delay, the last one
  repeating; no jitter, no cap (``RETRY_BACKOFF_MAX`` caps the exponential backoff only).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence

from . import limits
from .exceptions import InvalidTaskOptions, Retry

#: Longest backoff schedule: more steps than any policy needs.
MAX_SCHEDULE_STEPS = 100

ExceptionClasses = tuple[type[BaseException], ...]


def exception_classes(value: object, option: str) -> ExceptionClasses:
    """An exception class or a tuple/list of them, as a tuple; else InvalidTaskOptions."""
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidTaskOptions(
                f"{option} must be an exception class or a tuple of them, e.g. "
                f"{option}=(ConnectionError, TimeoutError), not {value!r}.")
        if issubclass(item, Retry):
            raise InvalidTaskOptions(
                f"{option} can't list Retry: a task that raises Retry always asks for "
                "another attempt.")
    return tuple(items)


def backoff_schedule(value: object) -> tuple[float, ...]:
    """A list of retry delays in seconds, checked one by one (anything else, a single
    number included, is refused saying what is expected)."""
    if (isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value
            or len(value) > MAX_SCHEDULE_STEPS):
        raise InvalidTaskOptions(
            f"retry_backoff as a schedule must be a list of 1 to {MAX_SCHEDULE_STEPS} "
            f"delays in seconds, e.g. [1, 5, 30, 300], not {value!r}.")
    delays = []
    for index, delay in enumerate(value):
        problem = limits.seconds_problem(delay, f"retry_backoff[{index}]")
        if problem:
            raise InvalidTaskOptions(problem)
        assert isinstance(delay, int | float)
        delays.append(float(delay))
    return tuple(delays)


def scheduled_delay(schedule: Sequence[float], attempt: int) -> float:
    """The delay after failed attempt number ``attempt`` (1-based): the last one repeats."""
    return schedule[min(max(attempt, 1), len(schedule)) - 1]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do after a failed attempt."""

    retry: bool
    #: Seconds to wait before the retry; None: the message's exponential backoff.
    delay: float | None = None
    #: Why, for the attempt's log line ('' for an ordinary failure).
    why: str = ""


def _name(error: BaseException) -> str:
    return type(error).__qualname__


def decide(error: BaseException, attempt: int, *, retry_on: ExceptionClasses = (),
           dont_retry: ExceptionClasses = (), schedule: Sequence[float] = (),
           now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> Decision:
    """Whether (and when) a message whose attempt ``attempt`` raised ``error`` retries,
    attempts allowing. ``now`` is the database clock, for ``Retry(at=...)``."""
    usual = scheduled_delay(schedule, attempt) if schedule else None
    if isinstance(error, Retry):
        if error.in_seconds is not None:
            delay: float | None = error.in_seconds
        elif error.at is not None:
            delay = min(max(0.0, (error.at - now()).total_seconds()), limits.MAX_SECONDS)
        else:
            delay = usual
        shown = "the usual backoff" if delay is None else f"{delay:g}s"
        return Decision(True, delay, f"the task asked for a retry after {shown}")
    if dont_retry and isinstance(error, dont_retry):
        return Decision(False, why=f"{_name(error)} is in dont_retry, so it is not retried")
    if retry_on and not isinstance(error, retry_on):
        return Decision(False, why=f"{_name(error)} is not in retry_on, so it is not retried")
    return Decision(True, usual)
