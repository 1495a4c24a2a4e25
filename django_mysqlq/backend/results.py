"""``TaskResult`` from the queue's tables: the message row (while it is unfinished) and
its history rows in ``mysqlq_attempt`` (one per attempt).

Status: ready, scheduled or blocked -> READY; claimed -> RUNNING; dead -> FAILED. Once
the message left the table, its last history row decides: succeeded -> SUCCESSFUL,
failed or cancelled -> FAILED (retried or lost would mean it is still queued: READY).
Django's ``TaskResultStatus`` has no CANCELLED: a cancelled task's ``errors`` end with a
:class:`TaskCancelled` entry naming who cancelled it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from ..conf import get_settings
from ..exceptions import PayloadDecodeError, UnknownTask
from ..limits import row_id
from ..models import Attempt, Message, MessageStatus, Outcome
from . import wire
from .compat import (
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from .lookup import find_task

#: ``error_class`` of history rows written for a vanished worker.
LOST_ERROR_CLASS = "WorkerLost"

_FAILED_ATTEMPTS = frozenset({Outcome.RETRIED, Outcome.FAILED, Outcome.LOST})
_MESSAGE_STATUS: dict[str, TaskResultStatus] = {
    MessageStatus.READY: TaskResultStatus.READY,
    MessageStatus.SCHEDULED: TaskResultStatus.READY,
    MessageStatus.BLOCKED: TaskResultStatus.READY,
    MessageStatus.CLAIMED: TaskResultStatus.RUNNING,
    MessageStatus.DEAD: TaskResultStatus.FAILED,
}
_FINAL_OUTCOME_STATUS: dict[str, TaskResultStatus] = {
    Outcome.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    Outcome.FAILED: TaskResultStatus.FAILED,
    Outcome.CANCELLED: TaskResultStatus.FAILED,
}
#: What an attempt's recorded outcome leaves the task as (``lost``: it runs again).
OUTCOME_STATUS: dict[str, TaskResultStatus] = {
    **_FINAL_OUTCOME_STATUS,
    Outcome.RETRIED: TaskResultStatus.READY,
    Outcome.LOST: TaskResultStatus.READY,
}


class WorkerLost(Exception):
    """Stands in ``TaskResult.errors`` for an attempt whose worker vanished while it ran
    (a ``lost`` history row): the traceback holds the reason the sweeper gave."""


class TaskCancelled(Exception):
    """Stands in ``TaskResult.errors`` for a message cancelled before it succeeded (a
    ``cancelled`` history row: ``queuecancel``, the admin, the purge of dead messages, a
    dropped consumer group). Django's ``TaskResultStatus`` has no CANCELLED, so the task
    reads FAILED; the traceback text says who cancelled it (``cancelled by cli:root``)."""


def _cancelled_error(row: Attempt) -> TaskError:
    path = f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}"
    note = row.error_message if row.error_message not in ("", "cancelled") else ""
    text = f"{path}: cancelled by {row.actor or 'an operator'}" + (f" ({note})" if note
                                                                   else "")
    return TaskError(exception_class_path=path, traceback=text)


def error_of(row: Attempt) -> TaskError | None:
    """The ``TaskError`` of a failed attempt's history row, or of a cancelled message's
    (:class:`TaskCancelled`); None for other rows."""
    if row.outcome == Outcome.CANCELLED:
        return _cancelled_error(row)
    if row.outcome not in _FAILED_ATTEMPTS or not row.error_class:
        return None
    path = row.error_class
    if path == LOST_ERROR_CLASS:
        path = f"{WorkerLost.__module__}.{WorkerLost.__qualname__}"
    text = row.traceback or f"{row.error_class}: {row.error_message}"
    return TaskError(exception_class_path=path, traceback=text)


def errors_of(rows: Sequence[Attempt]) -> list[TaskError]:
    return [error for error in map(error_of, rows) if error is not None]


def worker_ids_of(rows: Sequence[Attempt], attempts: int, current: str | None) -> list[str]:
    """One worker id per attempt made so far (so ``TaskContext.attempt`` is the attempt
    number); ``current`` is the holder of the attempt running now."""
    by_attempt: dict[int, str] = {}
    for row in rows:
        by_attempt.setdefault(row.attempt, row.worker_id)
    ids = [by_attempt.get(number, "") for number in range(1, attempts + 1)]
    if current is not None and ids:
        ids[-1] = current
    return ids


def first_start(rows: Sequence[Attempt]) -> dt.datetime | None:
    starts = [row.started_at for row in rows if row.started_at is not None]
    return min(starts) if starts else None


def last_start(rows: Sequence[Attempt]) -> dt.datetime | None:
    starts = [row.started_at for row in rows if row.started_at is not None]
    return max(starts) if starts else None


def history(message_id: int) -> list[Attempt]:
    return list(Attempt.objects.using(get_settings().DATABASE).for_message(message_id))


def as_enqueued(task: Task[..., Any], backend: str, queue: str, priority: int,
                run_after: dt.datetime | None) -> Task[..., Any]:
    """The task with the options its message was enqueued with, where they still
    validate (a queue since dropped from ``QUEUES``, or a backend alias since renamed,
    keeps the declared one)."""
    try:
        return task.using(backend=backend, queue_name=queue, priority=priority,
                          run_after=run_after)
    except (InvalidTask, InvalidTaskBackend):
        return task


def _configured_aliases() -> set[str]:
    configured = getattr(settings, "TASKS", None)
    return set(configured) if isinstance(configured, dict) else set()


def _message_id(result_id: object) -> int:
    found = row_id(result_id) if isinstance(result_id, str) else None
    if found is not None:
        return found
    raise TaskResultDoesNotExist(
        f"{result_id!r} is not the id of a task result of this backend (ids are message "
        "ids: strings of digits).")


def read_result(alias: str, result_id: str) -> TaskResult[..., Any]:
    """The ``TaskResult`` of message ``result_id`` as the tables hold it now."""
    message_id = _message_id(result_id)
    db = get_settings().DATABASE
    # The message first: if it is gone by then, its final history row (written in the
    # same transaction as the delete) is visible to the history query that follows.
    message = Message.objects.using(db).filter(pk=message_id).first()
    rows = history(message_id)
    if message is None and not rows:
        raise TaskResultDoesNotExist(
            f"No task result {result_id!r}: it was never committed (the enqueuing "
            "transaction rolled back or is still open), or its history was purged.")
    name = message.task_name if message is not None else rows[-1].task_name
    if not wire.is_django_task_name(name):
        raise TaskResultDoesNotExist(
            f"Message {result_id} is a @queue_task message ({name!r}), not a Django task: "
            "use its MessageHandle instead.")
    text = message.payload if message is not None else next(
        (row.payload for row in reversed(rows) if row.payload), "")
    try:
        decoded = wire.decode(text)
    except PayloadDecodeError:
        decoded = wire.DecodedPayload(args=[], kwargs={}, backend=None, run_after=None)
    if decoded.backend not in (None, alias) and decoded.backend in _configured_aliases():
        raise TaskResultDoesNotExist(
            f"Task result {result_id!r} belongs to the backend {decoded.backend!r}, "
            f"not {alias!r}.")
    try:
        task = find_task(wire.module_path_of(name))
    except UnknownTask as exc:
        raise TaskResultDoesNotExist(
            f"Task result {result_id!r} is of a task this process can't load: {exc}") from exc
    queue = message.queue if message is not None else rows[-1].queue
    priority = message.priority if message is not None else rows[-1].priority
    task = as_enqueued(task, alias, queue, priority, decoded.run_after)

    if message is not None:
        status = _MESSAGE_STATUS.get(message.status, TaskResultStatus.READY)
        running = status == TaskResultStatus.RUNNING
        attempts = message.attempts
        enqueued_at = message.enqueued_at
        last_attempted = message.claimed_at if running else last_start(rows)
        finished_at = rows[-1].finished_at if status == TaskResultStatus.FAILED and rows \
            else None
        current = message.worker_id if running else None
        value: Any = None
    else:
        last = rows[-1]
        status = OUTCOME_STATUS.get(last.outcome, TaskResultStatus.READY)
        attempts = max(row.attempt for row in rows)
        enqueued_at = last.enqueued_at
        last_attempted = last_start(rows)
        finished_at = last.finished_at if last.outcome in _FINAL_OUTCOME_STATUS else None
        current = None
        value = last.result if status == TaskResultStatus.SUCCESSFUL else None

    result = TaskResult(
        task=task, id=str(message_id), status=status, enqueued_at=enqueued_at,
        started_at=first_start(rows) or last_attempted, finished_at=finished_at,
        last_attempted_at=last_attempted, args=decoded.args, kwargs=decoded.kwargs,
        backend=alias, errors=errors_of(rows),
        worker_ids=worker_ids_of(rows, attempts, current),
    )
    object.__setattr__(result, "_return_value", value)
    return result
