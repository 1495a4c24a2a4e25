"""Runs one claimed message and settles it through the broker (ack, retry or dead)."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from django.db import InterfaceError, OperationalError, transaction

from .. import awaiting, broker, payload, retries
from ..conf import get_settings
from ..context import TaskContext
from ..exceptions import PayloadDecodeError, TransactionLeftOpen, UnknownTask
from ..limits import storable
from ..log import one_line
from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import Outcome
from ..registry import registry
from ..signals import task_finished, task_started
from ..tasks import AttemptScope, QueueTask
from .attempt_log import AttemptLine

logger = logging.getLogger("django_mysqlq")

#: How long settling one message keeps retrying through database outages.
SETTLE_PATIENCE_SECONDS = 120.0


def _describe(exc: BaseException, started_at: dt.datetime) -> AttemptResult:
    """The attempt's error for history; never raises, whatever the exception does."""
    try:
        message = str(exc)
    except Exception as str_error:  # noqa: BLE001 - a broken __str__ must not lose the attempt
        message = f"<str() of the exception failed: {type(str_error).__name__}>"
    try:
        trace = "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001
        trace = f"<the traceback of {type(exc).__qualname__} could not be formatted>"
    return AttemptResult(
        started_at=started_at,
        error_class=storable(f"{type(exc).__module__}.{type(exc).__qualname__}"),
        error_message=storable(message[:10_000]),
        traceback=storable(trace[-60_000:]),
    )


def _call(func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    # (An async task's sync_to_async database calls come back to this task thread and
    # its connection, not to one thread shared by all: see awaiting.call.)
    return awaiting.call(func, *args, **kwargs)


class ClaimLost(Exception):
    """An atomic task's claim was recovered by a peer while it ran: roll its work back."""


class _Aborted(Exception):
    """An atomic task's attempt was failed for its timeout meanwhile: roll its work back."""


#: What ``execute`` returns for an attempt failed for its timeout while it ran: the control
#: thread recorded, logged and counted it (``draining.abort_for_timeout``), not its thread.
ABORTED = "aborted"


def _always() -> bool:
    return True


def _always_begins(task: QueueTask[Any, Any], scope: AttemptScope | None) -> bool:
    return True


#: Told the task and its attempt's scope just before the attempt starts (``task_started``):
#: False if the attempt was failed for its timeout already (``Holdings.began``).
Began = Callable[[QueueTask[Any, Any], AttemptScope | None], bool]


def _run_atomically(func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any],
                    message: ClaimedMessage, runner: Runner, started_at: dt.datetime,
                    may_end: Callable[[], bool]) -> Any:
    """Run the body and the ack in one transaction: both commit, or neither does."""
    # (The worker's database: an atomic task's own writes there commit with its ack.)
    with transaction.atomic(using=broker.default_alias()):
        # (Async bodies are refused at declaration; one that slips past, a plain function
        # returning a coroutine, fails here rather than being acked without running.)
        value = awaiting.refuse_awaitable(func(*args, **kwargs), message.task_name)
        if not may_end():
            raise _Aborted
        if not broker.ack_within(message, runner, AttemptResult(started_at, result=value)):
            raise ClaimLost
    return value


def settle(operation: Callable[[], Any], what: str, give_up: threading.Event,
           deadline: Callable[[], float | None] = lambda: None) -> Any:
    """Run a broker write, riding out connection loss until it lands or patience runs out.

    Patience ends after ``SETTLE_PATIENCE_SECONDS``, at ``deadline()`` (a stopping
    worker's), or when ``give_up`` is set. If the write never lands the claim stays
    behind and a peer recovers it (the task runs again: at-least-once). A statement the
    server refuses as such (too large, a failed check) is no outage: that error is raised
    at once for the caller to deal with.
    """
    patience = time.monotonic() + SETTLE_PATIENCE_SECONDS
    delay = 0.1
    while True:
        try:
            return operation()
        except (OperationalError, InterfaceError) as exc:
            if broker.is_refusal(exc):
                raise
            broker.close_if_broken()
            stop_at = deadline()
            end = patience if stop_at is None else min(patience, stop_at)
            now = time.monotonic()
            if now >= end or give_up.is_set():
                logger.error("Could not record the end of %s (%s); a peer will recover "
                             "and re-run it.", what, one_line(str(exc)))
                return None
            logger.warning("Database unavailable while settling %s (%s); retrying in "
                           "%.1fs.", what, one_line(str(exc)), delay)
            give_up.wait(min(delay, end - now))
            delay = min(delay * 2, 5.0)


def _describe_message(message: ClaimedMessage) -> str:
    return f"{message.task_name} #{message.id}"


class AckSink(Protocol):
    def add(self, message: ClaimedMessage, runner: Runner, result: AttemptResult,
            line: AttemptLine | None = None) -> None: ...


def execute(message: ClaimedMessage, runner: Runner, give_up: threading.Event,
            acks: AckSink | None = None, started_at: dt.datetime | None = None,
            may_end: Callable[[], bool] = _always, began: Began = _always_begins) -> str:
    """Run one message to its end; return the outcome recorded in history.

    With ``acks``, a success is handed over to be acked in a batch (and logged once its
    ack is written); without, it is acked and logged here and now. ``started_at``: when
    the worker let it start (default: now). Every other end is logged here, once.
    ``may_end``: asked once the task returned or raised; False when the attempt was failed
    for its timeout meanwhile (``Holdings.may_end``): then nothing of it is recorded or
    logged here, and ``ABORTED`` is returned (whoever failed it sends its ``task_finished``
    with the task and the scope ``began`` was told of: ``timeout_end``).
    """
    if started_at is None:
        started_at = broker.database_now()
    line = AttemptLine(message)
    try:
        task = registry.get(message.task_name)
    except UnknownTask as exc:
        return _defer_unknown(message, runner, _describe(exc, started_at), give_up, line)
    try:
        args, kwargs = payload.decode(message.payload)
    except PayloadDecodeError as exc:
        # Not the task's fault and no retry can fix it: straight to dead, with the reason.
        result = _describe(exc, started_at)
        written = settle(lambda: broker.fail(message, runner, result, retry=False),
                         _describe_message(message), give_up)
        outcome = str(Outcome.FAILED if written is not None else Outcome.LOST)
        line.write(outcome, result, "now dead: its payload can't be decoded, so no retry "
                   "can help" if written is not None else NOT_RECORDED)
        return outcome

    if task.takes_context:
        args = [TaskContext.of(message), *args]
    # From here on user code runs (hooks, signal receivers, the body): what it sends to
    # each connection is counted, so the leak check asks the server only when it must.
    marks = broker.activity_marks()
    # Hooks (Django's @task) wrap the call: context, their signals, a JSON return value.
    scope = task.hooks.begin(message, runner, started_at) if task.hooks is not None else None
    if not began(task, scope):
        return ABORTED
    value: Any = None
    acked = False
    try:
        # Inside the task boundary: whatever escapes a receiver fails the attempt, never
        # the thread (send_robust already logs and swallows all but KeyboardInterrupt).
        broker.send_robust(task_started, task, message_id=message.id, attempt=message.attempt)
        if task.atomic:
            value = _run_atomically(task.func, args, kwargs, message, runner, started_at,
                                    may_end)
            acked = True
        elif scope is not None:
            value = scope.run(args, kwargs)
        else:
            value = _call(task.func, args, kwargs)
    except _Aborted:
        broker.close_open_transactions(marks)
        return ABORTED
    except ClaimLost:
        line.write(str(Outcome.LOST), detail="a peer recovered its claim while it ran; its "
                   "transaction was rolled back and it runs again")
        return send_finished(task, scope, message, str(Outcome.LOST), None, None)
    except BaseException as exc:  # noqa: BLE001 - the task boundary: every failure is recorded
        line.stop_clock()
        # Settled inside the handler, so task_finished receivers see the exception as
        # sys.exc_info() (Django's own task logging prints the traceback from there).
        broker.close_open_transactions(marks)
        broker.close_if_broken()
        if not may_end():
            return ABORTED
        return _failed(task, scope, message, runner, exc, started_at, give_up, line)
    line.stop_clock()
    left_open = broker.close_open_transactions(marks)
    if not acked and not may_end():
        broker.close_if_broken()
        return ABORTED
    if left_open:
        # Its uncommitted writes (and an atomic task's ack) were just rolled back.
        try:
            raise TransactionLeftOpen(
                f"The task returned with a transaction still open on database(s) "
                f"{', '.join(left_open)}; its uncommitted writes were rolled back. Leave "
                "every transaction.atomic() block you enter and don't turn autocommit off."
            )
        except TransactionLeftOpen as exc:
            broker.close_if_broken()
            return _failed(task, scope, message, runner, exc, started_at, give_up, line)
    broker.close_if_broken()  # the task may have broken or closed the connection

    if not acked and acks is not None:
        acks.add(message, runner, AttemptResult(started_at=started_at, result=value), line)
        acked = True
    else:
        detail = ""
        if not acked:
            result = AttemptResult(started_at=started_at, result=value)
            written = settle(lambda: broker.ack(message, runner, result),
                             _describe_message(message), give_up)
            acked = bool(written)
            detail = NOT_RECORDED if written is None else RECOVERED_MEANWHILE
        line.write(str(Outcome.SUCCEEDED if acked else Outcome.LOST),
                   detail="" if acked else detail)
    # Not acked: the message stays queued and runs again, so say so.
    return send_finished(task, scope, message, str(Outcome.SUCCEEDED if acked else Outcome.LOST),
                     None, value)


#: The detail of an attempt whose end could not be written (``settle`` said why).
NOT_RECORDED = "its end could not be recorded; a peer recovers it and it runs again"
#: The detail of a success whose claim a peer had recovered (the acker's too).
RECOVERED_MEANWHILE = ("finished after its claim was recovered by a peer; it runs again "
                       "(at-least-once)")


def _defer_unknown(message: ClaimedMessage, runner: Runner, result: AttemptResult,
                   give_up: threading.Event, line: AttemptLine) -> str:
    """A task this worker doesn't know: give the message back for later, a bounded number of
    times, then dead. During a rolling deploy an old worker may claim a new task's message;
    a worker that knows the task will take it then."""
    limit = get_settings().UNKNOWN_TASK_RETRIES
    written = settle(lambda: broker.defer(message, runner, result, limit),
                     _describe_message(message), give_up)
    if written is None:
        line.write(str(Outcome.LOST), detail=NOT_RECORDED)
        return str(Outcome.LOST)
    unknown = ("no task of that name is registered in this worker (a rolling deploy? a "
               "module missing from MYSQLQ['TASK_MODULES']?)")
    if written.outcome == Outcome.DEFERRED:
        line.write(str(written.outcome), detail=f"{unknown}; gave it back to run in "
                   f"{written.delay:.0f}s (deferral {written.deferrals} of {limit})")
    else:
        line.write(str(written.outcome), result, f"now dead: {unknown}, and it was given "
                   f"back {limit} times already")
    return str(written.outcome)


def _failed(task: QueueTask[Any, Any], scope: AttemptScope | None, message: ClaimedMessage,
            runner: Runner, error: BaseException, started_at: dt.datetime,
            give_up: threading.Event, line: AttemptLine) -> str:
    result = _describe(error, started_at)
    decision = retries.decide(error, message.attempt, retry_on=task.retry_on,
                              dont_retry=task.dont_retry, schedule=task.retry_schedule,
                              now=broker.database_now)
    written = settle(lambda: broker.fail(message, runner, result, retry=decision.retry,
                                         retry_in=decision.delay),
                     _describe_message(message), give_up)
    outcome = written if written is not None else str(Outcome.LOST)
    if written == Outcome.FAILED:
        # The one line with the traceback after it; retries keep theirs in history. A
        # Django task's traceback is logged by Django (the django.tasks logger, from the
        # task_finished signal): printing it here too would show it twice.
        why = decision.why if not decision.retry else "no attempts left" + (
            f" ({decision.why})" if decision.why else "")
        line.write(outcome, result, f"now dead: {why}",
                   error=error if scope is None else None)
    elif written == Outcome.LOST:
        line.write(outcome, result, "failed after its claim was recovered by a peer; its new "
                   "owner decides what happens next")
    else:
        line.write(outcome, result, decision.why if written is not None else NOT_RECORDED)
    return send_finished(task, scope, message, outcome, error, None)


def send_finished(task: QueueTask[Any, Any], scope: AttemptScope | None,
                  message: ClaimedMessage, outcome: str, error: BaseException | None,
                  value: Any) -> str:
    """``task_finished``, and the end of its scope (a Django task's), once an attempt's
    outcome is recorded; inside the handler of ``error`` when there is one."""
    broker.send_robust(task_finished, task, message_id=message.id, attempt=message.attempt,
                       outcome=outcome, error=error)
    if scope is not None:
        scope.finished(outcome, value, error)
    return outcome
