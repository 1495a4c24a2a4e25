"""``MySQLQueueBackend``: Django's Tasks framework on top of this queue.

``task.enqueue()`` writes one queue message in the caller's transaction (through
``broker.enqueue``, like ``@queue_task``); ``runqueueworker`` runs it with the same
claims, recovery, retries and history; ``get_result()`` reads the message and its
history back as a ``TaskResult``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from asgiref.sync import sync_to_async
from django.core.checks import CheckMessage
from django.db import transaction
from django.utils import timezone

from .. import broker, calls
from ..conf import get_settings
from ..exceptions import ArgumentEncodingError
from ..messages import NewMessage
from ..models import Attempt, Message
from ..routing import alias_for_queue
from . import checks, immediate, reach, results, wire
from .compat import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .kind import RunsOnThisQueue
from .options import (
    VALIDATORS,
    BackendOptions,
    queue_problem,
    run_after_problem,
    value_problem,
)

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from typing import TypeAlias

    _TaskBase: TypeAlias = Task[..., Any]
else:
    _TaskBase = Task


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MySQLQueueTask(_TaskBase):
    """A Django task with this queue's per-task options.

    ``@task(max_attempts=5, retry_backoff=10, timeout=60)`` (Django forwards extra
    keyword arguments of ``@task`` to the backend's ``task_class``). ``None`` means 'the
    backend's ``OPTIONS``, else the default': one attempt, as on Django's own backends,
    and ``MYSQLQ``'s backoff.
    """

    max_attempts: int | None = None
    retry_backoff: float | None = None
    timeout: float | None = None


class MySQLQueueBackend(RunsOnThisQueue, BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "django_mysqlq.backend.MySQLQueueBackend", ...}}``."""

    task_class = MySQLQueueTask

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.params = params
        self.queue_options = BackendOptions.parse(params.get("OPTIONS", {}))

    # ----------------------------------------------------------------- validation

    def validate_task(self, task: Task[..., Any]) -> None:
        super().validate_task(task)
        problem = queue_problem(task.queue_name)
        if problem:
            raise InvalidTask(problem)
        name = wire.message_name(task.module_path)
        if len(name) > wire.NAME_MAX:
            raise InvalidTask(
                f"The task's message name {name!r} is longer than {wire.NAME_MAX} "
                "characters: use a shorter module path or function name.")
        for option in VALIDATORS:
            problem = value_problem(option, getattr(task, option, None))
            if problem:
                raise InvalidTask(problem)
        problem = run_after_problem(task.run_after, timezone.now())
        if problem:
            raise InvalidTask(problem)

    # ----------------------------------------------------------------- enqueue

    def enqueue(self, task: Task[P, R], args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> TaskResult[P, R]:
        """Write the message in the caller's transaction; ``task_enqueued`` follows the
        commit. Before anything is written: a task no worker would find raises
        ``InvalidTask``, arguments that don't fit the function ``TaskArgumentError``, and
        arguments that aren't JSON ``ArgumentEncodingError``. With ``MYSQLQ['IMMEDIATE']``
        the task runs in this process after the commit instead."""
        self.validate_task(task)
        if self.queue_options.problems:
            raise InvalidTaskBackend(
                f"TASKS[{self.alias!r}]['OPTIONS'] is invalid: "
                + " ".join(self.queue_options.problems))
        reach.check_reachable(task)
        calls.check_call(task.module_path, task.func, args, kwargs,
                         skip_first=task.takes_context)
        name = wire.message_name(task.module_path)
        call_args, call_kwargs = _normalized(task.module_path, args, kwargs)
        conf = get_settings()
        if alias_for_queue(task.queue_name) != conf.DATABASE:
            # (Its result, its task_enqueued hook and a worker's reading of its attempts
            # go to MYSQLQ['DATABASE']: written elsewhere, get_result missed it, or found
            # another message with the same id. Check E107 says it for QUEUES.)
            raise InvalidTask(
                f"Queue {task.queue_name!r} is placed on {alias_for_queue(task.queue_name)!r} "
                f"(MYSQLQ['QUEUES'] or a router); a Django task's queue must live on "
                f"MYSQLQ['DATABASE'] ({conf.DATABASE!r}). Use @queue_task for tasks on "
                "another database.")
        max_attempts, retry_backoff, timeout = self.queue_options.resolved(task)
        message = NewMessage(
            task_name=name,
            queue=task.queue_name,
            priority=int(task.priority),
            payload=wire.encode(name, call_args, call_kwargs, self.alias, task.run_after,
                                conf.MAX_PAYLOAD_BYTES),
            run_at=task.run_after,
            delay=0.0,
            max_attempts=max_attempts,
            retry_backoff=retry_backoff,
            timeout=timeout,
            dedup_key=None,
        )
        if conf.IMMEDIATE:
            return cast("TaskResult[P, R]", immediate.enqueue(
                self.alias, type(self), task, call_args, call_kwargs, message))
        [message_id] = broker.enqueue([message])
        enqueued_at = _enqueued_at(conf.DATABASE, message_id)
        result = TaskResult(
            task=task, id=str(message_id), status=TaskResultStatus.READY,
            enqueued_at=enqueued_at, started_at=None, finished_at=None,
            last_attempted_at=None, args=call_args, kwargs=call_kwargs, backend=self.alias,
            errors=[], worker_ids=[],
        )
        transaction.on_commit(
            functools.partial(broker.send_robust, task_enqueued, type(self), task_result=result),
            using=conf.DATABASE)
        return result

    async def aenqueue(self, task: Task[P, R], args: Sequence[Any],
                       kwargs: Mapping[str, Any]) -> TaskResult[P, R]:
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    # ----------------------------------------------------------------- results

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """The task's state now; ``TaskResultDoesNotExist`` for ids this backend doesn't
        know (never committed, another backend's, a ``@queue_task`` message, or purged).
        In test mode, the results of tasks this process ran."""
        if get_settings().IMMEDIATE:
            return immediate.read_result(self.alias, result_id)
        return results.read_result(self.alias, result_id)

    async def aget_result(self, result_id: str) -> TaskResult[..., Any]:
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)

    # ----------------------------------------------------------------- checks

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        return checks.check_backend(self)


class ArgumentValueError(ArgumentEncodingError, ValueError):
    """An argument Django's own backends refuse with a ``ValueError`` (``bytes`` that
    aren't UTF-8); an ``ArgumentEncodingError`` too."""


def _labelled(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [*((f"positional argument {index}", value) for index, value in enumerate(args)),
            *((f"argument {key!r}", value) for key, value in kwargs.items())]


def _normalized(task_path: str, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The arguments as Django's ``TaskResult`` holds them (tuples as lists, bytes as
    text). One that isn't JSON raises with the message Django's own backends give
    (``Unsupported type: <class 'datetime.datetime'>``), naming the argument."""
    try:
        normal_args, normal_kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
    except (TypeError, ValueError, RecursionError) as exc:
        for label, value in _labelled(args, kwargs):
            try:
                normalize_json(value)
            except (TypeError, ValueError, RecursionError) as found:
                kind = ArgumentValueError if isinstance(found, ValueError) \
                    else ArgumentEncodingError
                raise kind(
                    f"{found} ({label} of task {task_path!r}). Task arguments must be JSON "
                    "values (str, int, float, bool, None, list, dict): pass a primary key "
                    "or plain data instead of the object.") from found
        raise ArgumentEncodingError(
            f"{exc} (the arguments of task {task_path!r}).") from exc
    assert isinstance(normal_args, list) and isinstance(normal_kwargs, dict)
    return normal_args, normal_kwargs


def _enqueued_at(alias: str, message_id: int) -> dt.datetime:
    """When the message was enqueued: from its row, or (a worker woken by the commit ran
    and acked it before this read) from its history; never None, which Django's
    ``TaskResult.enqueued_at`` is not."""
    found = (Message.objects.using(alias).filter(pk=message_id)
             .values_list("enqueued_at", flat=True).first())
    if found is None:
        found = (Attempt.objects.using(alias).filter(message_id=message_id)
                 .order_by("id").values_list("enqueued_at", flat=True).first())
    return found if found is not None else broker.database_now()
