"""Errors raised by the queue's public API. Each message says what to do next."""

from __future__ import annotations

import datetime as dt

from . import limits


class QueueError(Exception):
    """Base class of every error django-mysqlq raises on purpose."""


class ArgumentEncodingError(QueueError, TypeError):
    """A task argument can't be encoded as JSON; nothing was written."""


class TaskArgumentError(QueueError, TypeError):
    """An ``enqueue()`` call doesn't fit the task function's signature; nothing was written."""


class PayloadTooLarge(QueueError, ValueError):
    """The encoded arguments exceed ``MYSQLQ['MAX_PAYLOAD_BYTES']``; nothing was written."""


class InvalidTaskOptions(QueueError, ValueError):
    """A ``@queue_task`` or ``.using()`` option has a value the queue can't honour."""


class TaskAlreadyRegistered(QueueError, ValueError):
    """Two different functions were registered under one task name."""


class UnknownTask(QueueError, LookupError):
    """A message names a task that isn't registered in this worker."""


class PayloadDecodeError(QueueError, ValueError):
    """A message's stored payload is not the JSON object the queue wrote."""


class MessageDoesNotExist(QueueError, LookupError):
    """No message or history with this id exists."""


class TaskTimeout(QueueError):
    """A task ran past its ``timeout`` and its worker process was restarted (process mode)."""


class TransactionLeftOpen(QueueError):
    """A task returned inside a transaction; the worker rolled it back and failed the attempt."""


class WaitTimeout(QueueError, TimeoutError):
    """``handle.wait(timeout=...)`` ran out of time before the message finished."""


class Retry(QueueError):
    """Raised by a task to ask for another attempt: after ``in_seconds``, at ``at`` (an
    aware datetime), or, with neither, after the task's usual backoff.

    The attempt is recorded as ``retried`` with ``reason`` and counts against
    ``max_attempts``: on the last attempt the message goes dead instead, so a task can't
    retry itself forever. ``retry_on`` and ``dont_retry`` don't apply to it.
    """

    def __init__(self, in_seconds: float | None = None, *, at: dt.datetime | None = None,
                 reason: str = "") -> None:
        if in_seconds is not None and at is not None:
            raise InvalidTaskOptions("Retry() takes in_seconds or at, not both.")
        problem = (limits.seconds_problem(in_seconds, "Retry(in_seconds=...)")
                   if in_seconds is not None else None)
        if at is not None:
            # (Past 100 years the server's date arithmetic overflowed: the retry's
            # statement failed and the claim was left to recovery, run alone each time.)
            problem = limits.run_at_problem(at, dt.datetime.now(dt.UTC), "Retry(at=...)")
        if problem:
            raise InvalidTaskOptions(problem)
        self.in_seconds = None if in_seconds is None else float(in_seconds)
        self.at = at
        self.reason = reason
        when = (f"in {self.in_seconds:g}s" if self.in_seconds is not None
                else f"at {at.isoformat()}" if at is not None else "after the usual backoff")
        super().__init__(f"the task asked to be retried {when}" + (f": {reason}" if reason
                                                                    else ""))


class WorkerCannotRun(QueueError):
    """The database can't serve the worker until someone acts (tables missing, the database
    unknown, the login or a grant refused): no retry helps, so the worker exits at once
    with ``exit_status`` instead of waiting."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status
