"""Errors raised by the queue's public API. Each message says what to do next."""

from __future__ import annotations


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


class WorkerCannotRun(QueueError):
    """The database can't serve the worker until someone acts (tables missing, the database
    unknown, the login or a grant refused): no retry helps, so the worker exits at once
    with ``exit_status`` instead of waiting."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status
