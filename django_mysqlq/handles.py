"""What ``enqueue()`` returns: a message id, a way to read its state later, and to wait
for its end.

Waiting polls the message's state with a growing pause (``WAIT_FIRST_SECONDS``, doubling
up to ``MYSQLQ['POLL_SECONDS']``), one primary-key read per poll, and sleeps through a
scheduled message's wait: no loop against the database, and nothing added to the
workers' path (no waiter bookkeeping on the ack). See docs/tasks.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async

from .exceptions import MessageDoesNotExist, WaitTimeout

#: First pause between two reads of a waited-on message; it doubles up to POLL_SECONDS.
WAIT_FIRST_SECONDS = 0.01


@dataclasses.dataclass(frozen=True)
class MessageState:
    """A message as it is now: in the hot table, or finished (from its last history row).

    ``status`` is one of ``ready``, ``scheduled``, ``claimed``, ``blocked``, ``dead``
    (unfinished) or ``succeeded``, ``cancelled`` (finished).
    """

    id: int
    task_name: str
    queue: str
    status: str
    attempts: int
    enqueued_at: dt.datetime
    run_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_error: str
    result: Any

    @property
    def is_finished(self) -> bool:
        """True when nothing more will happen without an operator: succeeded, cancelled, dead."""
        return self.status in ("succeeded", "cancelled", "dead")


def read_state(message_id: int, database: str | None = None) -> MessageState:
    """The current state of one message on the queue database ``database`` (None:
    ``MYSQLQ['DATABASE']``), or :class:`MessageDoesNotExist`."""
    from .conf import get_settings
    from .models import Attempt, Message

    db = database or get_settings().DATABASE
    message = Message.objects.using(db).filter(pk=message_id).first()
    if message is not None:
        return MessageState(
            id=message.pk,
            task_name=message.task_name,
            queue=message.queue,
            status=message.status,
            attempts=message.attempts,
            enqueued_at=message.enqueued_at,
            run_at=message.run_at,
            finished_at=None,
            last_error=message.last_error,
            result=None,
        )
    last = Attempt.objects.using(db).for_message(message_id).last()
    if last is None:
        raise MessageDoesNotExist(
            f"No message {message_id} exists: it was never committed (its transaction "
            "rolled back), or its history was purged."
        )
    return MessageState(
        id=message_id,
        task_name=last.task_name,
        queue=last.queue,
        status=last.outcome,
        attempts=last.attempt,
        enqueued_at=last.enqueued_at,
        run_at=None,
        finished_at=last.finished_at,
        last_error=last.error_message,
        result=last.result,
    )


@dataclasses.dataclass(frozen=True)
class MessageResult:
    """How a message ended, as ``wait()`` returns it."""

    id: int
    task_name: str
    #: ``succeeded``, ``dead`` or ``cancelled``.
    status: str
    #: The task's return value (as stored: JSON) when it succeeded, else None.
    value: Any
    #: The last error (``"module.Class: message"``) when it did not succeed, else ''.
    error: str
    attempts: int
    #: When it finished; for a dead message, when it died.
    finished_at: dt.datetime | None

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @property
    def outcome(self) -> str:
        """The same as ``status``: how it ended (``succeeded``, ``dead`` or ``cancelled``)."""
        return self.status

    @property
    def result(self) -> Any:
        """The same as ``value`` (the name :class:`MessageState` uses)."""
        return self.value

    @classmethod
    def of(cls, state: MessageState) -> MessageResult:
        succeeded = state.status == "succeeded"
        return cls(id=state.id, task_name=state.task_name, status=state.status,
                   value=state.result if succeeded else None,
                   error="" if succeeded else state.last_error, attempts=state.attempts,
                   finished_at=state.finished_at if state.finished_at is not None
                   or state.status != "dead" else state.run_at)


class _Waiting:
    """One wait's clock: when to read the state next, and when to give up."""

    def __init__(self, handle: MessageHandle, timeout: float | None) -> None:
        from .conf import get_settings

        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0 or None, not "
                             f"{timeout!r}.")
        _refuse_inside_transaction(handle)
        self.handle = handle
        self.timeout = timeout
        self.began = time.monotonic()
        self.deadline = float("inf") if timeout is None else self.began + timeout
        self.pause = WAIT_FIRST_SECONDS
        self.longest = get_settings().POLL_SECONDS

    def next_pause(self, state: MessageState) -> float:
        """Seconds to sleep before the next read; raise :class:`WaitTimeout` when done."""
        if state.is_finished:
            raise AssertionError("a finished message is not waited on")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(
                f"Message {self.handle.id} ({self.handle.task_name}) is still "
                f"{state.status} after {self.timeout:g}s (attempt {state.attempts}"
                f"{', last error: ' + state.last_error[:200] if state.last_error else ''}). "
                "It goes on in the queue: wait again, or read handle.state() later.")
        pause = self.pause
        self.pause = min(self.pause * 2, self.longest)
        if state.status == "scheduled" and state.run_at is not None:
            from .broker import database_now

            # Nothing happens before its run_at: sleep until then, reading at least
            # every ten pauses (an operator may requeue it meanwhile).
            until = (state.run_at - database_now()).total_seconds()
            pause = max(pause, min(until, self.longest * 10))
        return max(0.0, min(pause, left))


def _refuse_inside_transaction(handle: MessageHandle) -> None:
    """Waiting inside an open transaction on the queue database can only time out."""
    from django.db import connections

    from .broker.base import only_test_transactions
    from .conf import get_settings

    connection = connections[handle.database or get_settings().DATABASE]
    if connection.in_atomic_block and not only_test_transactions(connection):
        raise RuntimeError(
            f"wait() on message {handle.id} inside transaction.atomic() on the queue's "
            "database: a message enqueued in this transaction reaches no worker before it "
            "commits, and the transaction's snapshot may never show the end. Wait after "
            "the commit (outside the block, or in transaction.on_commit).")


@dataclasses.dataclass(frozen=True)
class MessageHandle:
    """The id of an enqueued message, its task name, and the alias of its queue's database
    (None: ``MYSQLQ['DATABASE']``; ids are per database)."""

    id: int
    task_name: str
    database: str | None = None

    def state(self) -> MessageState:
        return read_state(self.id, self.database)

    async def astate(self) -> MessageState:
        return await sync_to_async(read_state)(self.id, self.database)

    @property
    def status(self) -> str:
        return self.state().status

    def wait(self, timeout: float | None = None) -> MessageResult:
        """Wait until the message succeeded, went dead or was cancelled; return how.

        Raises :class:`WaitTimeout` after ``timeout`` seconds (None: no limit), and
        :class:`MessageDoesNotExist` if there is no such message (its transaction rolled
        back, or its history was purged). A dead message is an answer too: check
        ``result.succeeded``.
        """
        return _wait_blocking(self, timeout, self.state, time.sleep)

    async def await_result(self, timeout: float | None = None) -> MessageResult:
        """``wait()`` for async code: reads run in a thread, pauses don't block the loop."""
        return await _wait_async(self, timeout, self.astate)


def _wait_blocking(handle: MessageHandle, timeout: float | None,
                   read: Callable[[], MessageState],
                   sleep: Callable[[float], None]) -> MessageResult:
    waiting = _Waiting(handle, timeout)
    while True:
        state = read()
        if state.is_finished:
            return MessageResult.of(state)
        sleep(waiting.next_pause(state))


async def _wait_async(handle: MessageHandle, timeout: float | None,
                      read: Callable[[], Awaitable[MessageState]]) -> MessageResult:
    waiting = await sync_to_async(_Waiting)(handle, timeout)
    while True:
        state = await read()
        if state.is_finished:
            return MessageResult.of(state)
        await asyncio.sleep(waiting.next_pause(state))
