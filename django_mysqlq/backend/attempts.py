"""One attempt of a Django task, wherever it runs: a worker, or this process in test mode.

``DjangoTaskHooks`` wrap each attempt with Django's part: a ``TaskContext`` with the real
attempt number, the ``task_started`` / ``task_finished`` signals, and a return value
normalized to JSON (one that isn't JSON fails the attempt, as on Django's backends).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import traceback
from typing import Any

from django.db import DatabaseError

from .. import broker
from ..broker.history import ResultOverLimit, storable_result
from ..exceptions import PayloadDecodeError
from ..messages import ClaimedMessage, Runner
from ..models import Attempt, Outcome
from . import results, wire
from .compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from .lookup import queue_alias

logger = logging.getLogger("django_mysqlq")


def stored_as_is(value: Any) -> Any:
    """``value`` if history keeps it as it is, else raise ``TypeError`` / ``ValueError``
    saying why: the attempt fails, on a worker as in the test mode, rather than a worker
    dropping (or changing) it at the ack while the test mode returns it intact."""
    if value is None:
        return value
    try:
        text = storable_result(value)
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start:exc.end]
        raise ValueError(f"The task's return value holds a lone surrogate ({bad!r}), which "
                         "isn't valid UTF-8: the queue can't store it.") from None
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"The task's return value can't be stored as JSON: it {exc}"
                        if isinstance(exc, ResultOverLimit) else
                        f"The task's return value isn't JSON the queue can store: {exc}") \
            from None
    if json.loads(text) != value:
        keys = _non_string_keys(value)
        back = next(iter(json.loads(json.dumps({keys[0]: None})))) if keys else None
        raise TypeError(f"The task's return value has a dict key that isn't a string "
                        f"({keys[0]!r}): JSON would give it back as {back!r}. "
                        "Use string keys." if keys else
                        "The task's return value doesn't come back the same from JSON.")
    return value


def _non_string_keys(value: Any) -> list[Any]:
    """The first dict key in ``value`` that isn't a string, if any (in a list: it may be
    None)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return [key]
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)
    return []


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
        return stored_as_is(normalize_json(result.task.call(*call_args, **kwargs)))

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
