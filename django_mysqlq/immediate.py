"""``MYSQLQ['IMMEDIATE']``: enqueued tasks run in this process once the enqueuing
transaction commits, and no queue table is touched, so a project can run its tests on
SQLite or PostgreSQL (or on MySQL without workers).

As on a worker: the signature and JSON checks happen at enqueue, and the task gets its
arguments back from the encoded payload (tuples arrive as lists); ``message_enqueued`` is
sent after the commit, ``task_started`` / ``task_finished`` around the call; an
``atomic=True`` body runs in one transaction; a return value is kept only if a worker could
store it. Unlike a worker: one attempt only (a failure makes the message dead at once, since
retrying would hide the failure from the test), ``delay`` / ``run_at`` don't wait, and the
task's exception is raised in the code that enqueued it unless
``MYSQLQ['IMMEDIATE_RAISE']`` is False.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import itertools
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from django.core.signals import setting_changed
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import receiver
from django.utils import timezone

from . import awaiting, payload
from .conf import get_settings
from .context import TaskContext
from .exceptions import MessageDoesNotExist, WaitTimeout
from .handles import MessageHandle, MessageResult, MessageState
from .messages import ClaimedMessage, NewMessage, Runner
from .routing import alias_for_queue
from .signals import message_enqueued, task_finished, task_started

if TYPE_CHECKING:
    from .tasks import AttemptScope, QueueTask

logger = logging.getLogger("django_mysqlq")

#: Ids of messages run in this process, counted from 1 (no row ever holds them).
_ids = itertools.count(1)
_pending_keys = threading.local()


#: Bumped when ``MYSQLQ`` changes (``immediate()`` entered or left, ``override_settings``,
#: pytest-django's ``settings``): every ``unique_for`` period made before ends then.
_generation = 0


class _Committed:
    """An ``on_commit`` marker: called once the transaction it was registered in commits."""

    ran = False

    def __call__(self) -> None:
        self.ran = True


@dataclasses.dataclass
class _Period:
    """A key kept taken after a success (``unique_for``), in this process only.

    It ends at ``until`` (monotonic clock), when the settings change, or when the
    transaction it was made in rolls back: a ``TestCase``'s, which never commits, so the
    next test starts with no period of this one.
    """

    handle: ImmediateHandle
    until: float
    generation: int
    connection: BaseDatabaseWrapper | None
    marker: _Committed | None

    def live(self) -> bool:
        if self.generation != _generation or self.until <= time.monotonic():
            return False
        if self.connection is None or self.marker is None or self.marker.ran:
            return True
        marker = self.marker
        return any(entry[1] is marker for entry in self.connection.run_on_commit) or any(
            entry[1] is marker for entry in _hooks_being_run(self.connection))


def _periods() -> dict[str, _Period]:
    """The ``unique_for`` periods of this thread, like the pending keys."""
    periods: dict[str, _Period] = _pending_keys.__dict__.setdefault("periods", {})
    return periods


def _start_period(key: str, handle: ImmediateHandle, seconds: float) -> None:
    connection = connections[get_settings().DATABASE]
    marker: _Committed | None = None
    if connection.in_atomic_block:  # a TestCase's transaction: it ran at once
        marker = _Committed()
        connection.on_commit(marker)
    _periods()[key] = _Period(handle, time.monotonic() + seconds, _generation,
                              connection if marker is not None else None, marker)


@receiver(setting_changed)
def _end_periods(*, setting: str, **kwargs: Any) -> None:
    """A new ``MYSQLQ`` (often the next test's ``immediate()``) keeps no period."""
    global _generation
    if setting == "MYSQLQ":
        _generation += 1
        _periods().clear()


def new_id() -> int:
    return next(_ids)


def worker_id() -> str:
    """Stands for the worker in results and history-like fields: this process."""
    return f"immediate:{socket.gethostname()}:{os.getpid()}"


@dataclasses.dataclass
class ImmediateRecord:
    """What became of one message run in this process; filled in at the commit."""

    id: int
    task_name: str
    queue: str
    enqueued_at: dt.datetime
    run_at: dt.datetime | None
    status: str = "ready"
    attempts: int = 0
    finished_at: dt.datetime | None = None
    last_error: str = ""
    result: Any = None
    #: The connection whose commit runs it, and the callback it waits in.
    waiting_on: BaseDatabaseWrapper | None = None
    callback: Callable[[], None] | None = None

    def rolled_back(self) -> bool:
        """True once the enqueuing transaction rolled back: the task will never run."""
        if self.status != "ready" or self.waiting_on is None:
            return False
        if any(entry[1] is self.callback for entry in self.waiting_on.run_on_commit):
            return False  # still waiting for the commit
        return not any(entry[1] is self.callback
                       for entry in _hooks_being_run(self.waiting_on))

    def state(self) -> MessageState:
        if self.rolled_back():
            raise MessageDoesNotExist(
                f"No message {self.id} exists: the transaction that enqueued it rolled back "
                "(immediate mode).")
        return MessageState(
            id=self.id, task_name=self.task_name, queue=self.queue, status=self.status,
            attempts=self.attempts, enqueued_at=self.enqueued_at, run_at=self.run_at,
            finished_at=self.finished_at, last_error=self.last_error, result=self.result)


def _hooks_being_run(connection: BaseDatabaseWrapper) -> list[Any]:
    """The hooks of ``connection``'s commit still to run, when a hook of it is running.

    Django empties ``run_on_commit`` both on a rollback and before it runs a commit's
    hooks (it pops them from a list of its own), so a hook registered before an enqueue
    would see that message as rolled back. That list lives in the frame of
    ``run_and_clear_commit_hooks`` above this one; outside the hooks there is none.
    """
    if not connection.run_commit_hooks_on_set_autocommit_on:
        return []  # set from the commit until its hooks have run
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "run_and_clear_commit_hooks" \
                and frame.f_locals.get("self") is connection:
            pending = frame.f_locals.get("current_run_on_commit")
            return pending if isinstance(pending, list) else []
        frame = frame.f_back
    return []


@dataclasses.dataclass(frozen=True)
class ImmediateHandle(MessageHandle):
    """A handle whose state lives in this process: no database is read."""

    record: ImmediateRecord = dataclasses.field(compare=False, repr=False, kw_only=True)

    def state(self) -> MessageState:
        return self.record.state()

    async def astate(self) -> MessageState:
        return self.record.state()

    def wait(self, timeout: float | None = None) -> MessageResult:
        """At once: the task ran at the commit, or it hasn't run yet and waiting can't help
        (it runs in this process when the enqueuing transaction commits)."""
        state = self.record.state()
        if state.is_finished:
            return MessageResult.of(state)
        raise WaitTimeout(
            f"Message {self.id} ({self.task_name}) has not run yet: in the test mode "
            "(MYSQLQ['IMMEDIATE']) it runs in this process when the transaction that "
            "enqueued it commits. Wait after the commit.")

    async def await_result(self, timeout: float | None = None) -> MessageResult:
        return self.wait(timeout)


class RunListener(Protocol):
    """Follows one ``enqueue()`` call's run (the Django Tasks backend keeps its result)."""

    def enqueued(self) -> None:
        """At the commit, before anything runs."""

    def started(self) -> None:
        """When the message's attempt begins, before ``task_started``."""

    def finished(self, record: ImmediateRecord, scope: AttemptScope | None) -> None:
        """After one message ran and its ``task_finished`` was sent."""


def enqueue(task: QueueTask[Any, Any], messages: Sequence[NewMessage], *,
            ids: Sequence[int] | None = None,
            listener: RunListener | None = None) -> list[ImmediateHandle]:
    """Handles for ``messages`` (already checked and encoded), run after the commit."""
    alias = get_settings().DATABASE
    now = timezone.now()
    pending: dict[str, ImmediateHandle] = _pending_keys.__dict__.setdefault("keys", {})
    periods = _periods()
    handles: list[ImmediateHandle] = []
    runs: list[tuple[NewMessage, ImmediateHandle]] = []
    for index, message in enumerate(messages):
        key = message.dedup_key
        if key is not None and key in pending and not pending[key].record.rolled_back() \
                and pending[key].record.status in ("ready", "claimed"):
            handles.append(pending[key])  # as in the queue: one pending message per key
            continue
        if key is not None and message.unique_for > 0 and key in periods:
            if periods[key].live():
                handles.append(periods[key].handle)  # succeeded, and its period runs
                continue
            del periods[key]
        record = ImmediateRecord(id=ids[index] if ids is not None else new_id(),
                                 task_name=message.task_name, queue=message.queue,
                                 enqueued_at=now, run_at=message.run_at)
        handle = ImmediateHandle(record.id, message.task_name, record=record)
        if key is not None:
            pending[key] = handle
        handles.append(handle)
        runs.append((message, handle))
    if runs:
        callback = functools.partial(_run_all, task, runs, listener)
        waiting_on = _after_commit(alias, callback)
        for _, handle in runs:
            if handle.record.status == "ready":  # not run at once
                handle.record.waiting_on, handle.record.callback = waiting_on, callback
    return handles


def _after_commit(alias: str, callback: Callable[[], None]) -> BaseDatabaseWrapper | None:
    """Run ``callback`` once the caller's transaction commits, or now in autocommit.

    A Django ``TestCase`` wraps each test in transactions that never commit; code that
    would run in autocommit in production runs in those only, so the callback runs at once
    there too (Django marks them ``_from_testcase``). Returns the connection whose commit
    will run it, or None if it ran.
    """
    from .broker.base import only_test_transactions

    connection = connections[alias]
    if connection.in_atomic_block and only_test_transactions(connection):
        callback()
        return None
    transaction.on_commit(callback, using=alias)
    return connection if connection.in_atomic_block else None


def _run_all(task: QueueTask[Any, Any], runs: list[tuple[NewMessage, ImmediateHandle]],
             listener: RunListener | None) -> None:
    from .broker import send_robust

    # Committed now: each record not run yet (the later ones of this batch) is ready.
    for _, handle in runs:
        handle.record.waiting_on = None
    if listener is not None:
        listener.enqueued()
    send_robust(message_enqueued, task.name, message_ids=[handle.id for _, handle in runs])
    first_error: BaseException | None = None
    pending: dict[str, ImmediateHandle] = _pending_keys.__dict__.setdefault("keys", {})
    for message, handle in runs:
        try:
            error = run_one(task, message, handle.record, listener)
        finally:
            if message.dedup_key is not None and pending.get(message.dedup_key) is handle:
                del pending[message.dedup_key]  # finished: the key is free again
                if message.unique_for > 0 and handle.record.status == "succeeded":
                    _start_period(message.dedup_key, handle, message.unique_for)
        if first_error is None:
            first_error = error
    if first_error is not None and get_settings().IMMEDIATE_RAISE:
        raise first_error


def _call(func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    return awaiting.call(func, *args, **kwargs)


def run_one(task: QueueTask[Any, Any], message: NewMessage, record: ImmediateRecord,
            listener: RunListener | None = None) -> BaseException | None:
    """Run one message's single attempt; return its exception, if it raised one."""
    from .broker import send_robust
    from .broker.history import result_json

    args, kwargs = payload.decode(message.payload)  # the worker's round trip
    started_at = timezone.now()
    claimed = ClaimedMessage(
        id=record.id, queue=message.queue, task_name=message.task_name,
        payload=message.payload, priority=message.priority, attempt=1,
        max_attempts=message.max_attempts, retry_backoff=message.retry_backoff,
        timeout=message.timeout, enqueued_at=record.enqueued_at, claim_token="",
        connection_id=None)
    runner = Runner(worker_id=worker_id(), host=socket.gethostname(), pid=os.getpid(),
                    thread=threading.current_thread().name)
    record.status, record.attempts = "claimed", 1
    if listener is not None:
        listener.started()
    if task.takes_context:
        args = [TaskContext.of(claimed), *args]
    scope = task.hooks.begin(claimed, runner, started_at) if task.hooks is not None else None
    send_robust(task_started, task, message_id=record.id, attempt=1)
    try:
        if task.atomic:
            # (On the queue's own database, as a worker runs it: the task's writes
            # there roll back with a failure.)
            with transaction.atomic(using=alias_for_queue(message.queue)):
                value = awaiting.refuse_awaitable(task.func(*args, **kwargs), task.name)
        elif scope is not None:
            value = scope.run(args, kwargs)
        else:
            value = _call(task.func, args, kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the task boundary, as on a worker
        record.status = "dead"
        record.last_error = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
        if not get_settings().IMMEDIATE_RAISE:
            logger.error("%s #%s failed (immediate mode, not retried), now dead",
                         message.task_name, record.id, exc_info=exc)
        # Inside the handler, so receivers see the exception in sys.exc_info().
        _finished(task, scope, record, "failed", exc, None, listener)
        return exc
    text = result_json(claimed, value)
    record.status, record.finished_at = "succeeded", timezone.now()
    record.result = None if text is None else json.loads(text)
    _finished(task, scope, record, "succeeded", None, value, listener)
    return None


def _finished(task: QueueTask[Any, Any], scope: AttemptScope | None, record: ImmediateRecord,
              outcome: str, error: BaseException | None, value: Any,
              listener: RunListener | None) -> None:
    from .broker import send_robust

    send_robust(task_finished, task, message_id=record.id, attempt=1, outcome=outcome,
                error=error)
    if scope is not None:
        scope.finished(outcome, value, error)
    if listener is not None:
        listener.finished(record, scope)
