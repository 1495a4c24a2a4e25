"""The worker's side: running a Django task's message like any other.

``resolve_task`` is the registry's resolver for ``django.tasks:`` names (see ``lookup``
for which objects may run, and under which backend alias). The ``QueueTask`` it returns
carries ``DjangoTaskHooks``, so the executor claims, retries, records and recovers the
message exactly as for
``@queue_task``, while each attempt gets Django's part: a ``TaskContext`` with the real
attempt number, the ``task_started`` / ``task_finished`` signals, and a return value
normalized to JSON (one that isn't JSON fails the attempt, as on Django's backends).
"""

from __future__ import annotations

import datetime as dt
import logging
import traceback
from typing import Any

from django.db import DatabaseError

from .. import broker
from ..exceptions import PayloadDecodeError, UnknownTask
from ..messages import ClaimedMessage, Runner
from ..models import Attempt, Outcome
from ..tasks import QueueTask
from . import results, wire
from .compat import (
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from .core import MySQLQueueBackend
from .lookup import find_task
from .options import BackendOptions

logger = logging.getLogger("django_mysqlq")


def resolve_task(name: str) -> QueueTask[Any, Any]:
    """The runnable task for a ``django.tasks:`` message name, or ``UnknownTask``."""
    task = find_task(wire.module_path_of(name))
    # The message row holds the attempts, backoff and timeout it was enqueued with;
    # these copies only describe the task to this queue's own signals.
    backend = task.get_backend()
    options = backend.queue_options if isinstance(backend, MySQLQueueBackend) \
        else BackendOptions()
    max_attempts, retry_backoff, timeout = options.resolved(task)
    return QueueTask(func=task.func, name=name, queue=task.queue_name,
                     priority=int(task.priority), max_attempts=max_attempts,
                     retry_backoff=retry_backoff, timeout=timeout,
                     hooks=DjangoTaskHooks(task))


def queue_alias(task: Task[..., Any], enqueued_with: str | None) -> str:
    """The ``MySQLQueueBackend`` alias that runs ``task``: the one its message was
    enqueued with, else (a message written without one) the task's own backend.

    Raises ``UnknownTask`` when that alias is not a ``MySQLQueueBackend``: the task is
    not meant to run from this queue.
    """
    alias = enqueued_with if enqueued_with is not None else task.backend
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend as exc:
        raise UnknownTask(f"The task {task.module_path!r} names the backend {alias!r}, "
                          f"which is not configured in TASKS: {exc}") from exc
    if not isinstance(backend, MySQLQueueBackend):
        raise UnknownTask(
            f"The task {task.module_path!r} was enqueued for the backend {alias!r} "
            f"({type(backend).__name__}), not a MySQLQueueBackend: it is not run from this "
            "queue."
        )
    return alias


def resolve(name: str) -> QueueTask[Any, Any]:
    """``resolve_task``, with any unexpected failure reported as ``UnknownTask`` (the
    message then goes dead with the reason instead of troubling the worker)."""
    try:
        return resolve_task(name)
    except UnknownTask:
        raise
    except Exception as exc:
        raise UnknownTask(f"Could not resolve the Django task {name!r}: "
                          f"{type(exc).__name__}: {exc}") from exc


class DjangoTaskHooks:
    """Wraps the attempts of one Django task (see ``TaskHooks`` in ``tasks.py``)."""

    def __init__(self, task: Task[..., Any]) -> None:
        self.task = task

    def begin(self, message: ClaimedMessage, runner: Runner,
              started_at: dt.datetime) -> DjangoAttempt:
        return DjangoAttempt(self.task, message, runner, started_at)


class DjangoAttempt:
    """One attempt: builds the running ``TaskResult``, calls, then reports the outcome."""

    def __init__(self, task: Task[..., Any], message: ClaimedMessage, runner: Runner,
                 started_at: dt.datetime) -> None:
        self.task = task
        self.message = message
        self.runner = runner
        self.started_at = started_at
        self.result: TaskResult[..., Any] | None = None

    def _running_result(self, args: list[Any], kwargs: dict[str, Any]) -> TaskResult[..., Any]:
        message = self.message
        try:
            decoded = wire.decode(message.payload)
        except PayloadDecodeError:
            decoded = wire.DecodedPayload(args=args, kwargs=kwargs, backend=None,
                                          run_after=None)
        alias = queue_alias(self.task, decoded.backend)  # raises UnknownTask: not ours
        task = results.as_enqueued(self.task, alias, message.queue, message.priority,
                                   decoded.run_after)
        rows: list[Attempt] = []
        if message.attempt > 1:  # a first attempt has no history: save the query
            try:
                rows = [row for row in results.history(message.id)
                        if row.attempt < message.attempt]
            except DatabaseError:
                pass  # history is for the context only: the attempt still runs
        return TaskResult(
            task=task, id=str(message.id), status=TaskResultStatus.RUNNING,
            enqueued_at=message.enqueued_at,
            started_at=results.first_start(rows) or self.started_at, finished_at=None,
            last_attempted_at=self.started_at, args=args, kwargs=kwargs,
            backend=task.backend, errors=results.errors_of(rows),
            worker_ids=results.worker_ids_of(rows, message.attempt, self.runner.worker_id),
        )

    def run(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        result = self.result = self._running_result(args, kwargs)
        sender = type(result.task.get_backend())
        broker.send_robust(task_started, sender, task_result=result)
        call_args = [TaskContext(task_result=result), *args] if result.task.takes_context \
            else args
        # Task.call runs a coroutine through async_to_sync: its sync_to_async ORM calls
        # come back to this worker thread and its connection, as in a sync task.
        return normalize_json(result.task.call(*call_args, **kwargs))

    def finished(self, outcome: str, value: Any, error: BaseException | None) -> None:
        """Send ``task_finished`` with the state the recorded outcome left the task in.

        Called inside the executor's exception handler when the attempt failed, so
        receivers (Django's own task logging) see the exception in ``sys.exc_info()``.
        """
        result = self.result
        if result is None:
            return  # it never started: no task_started was sent either
        try:
            status = results.OUTCOME_STATUS.get(outcome, TaskResultStatus.READY)
            final = outcome in (Outcome.SUCCEEDED, Outcome.FAILED)
            object.__setattr__(result, "status", status)
            object.__setattr__(result, "finished_at", broker.database_now() if final else None)
            if status == TaskResultStatus.SUCCESSFUL:
                object.__setattr__(result, "_return_value", value)
            if error is not None:
                kind = type(error)
                result.errors.append(TaskError(
                    exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                    traceback="".join(traceback.format_exception(error)),
                ))
            broker.send_robust(task_finished, type(result.task.get_backend()),
                               task_result=result)
        except Exception:
            logger.exception("Could not report the end of %s #%s to Django's task signals",
                             self.message.task_name, self.message.id)
