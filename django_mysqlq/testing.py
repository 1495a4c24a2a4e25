"""Helpers for your tests.

``drain()`` runs what waits in the real MySQL queue, in the test's own process and on its
own connection, through the worker's code: the same claim, the same executor (signals,
leak check, ``atomic=True``), the same ack, retry and dead-letter statements and history
rows, and the same pump for the consumer groups this process knows (``testing_topics``).
Only the worker's threads, heartbeats, wake-ups and broadcast reader are left out.

``immediate()`` switches the test mode on (``MYSQLQ['IMMEDIATE']``) for a block, a test
or a test class: enqueued tasks run in-process after the commit, with no queue table.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.test.utils import override_settings

from .conf import get_settings
from .exceptions import MessageDoesNotExist, QueueError, UnknownTask
from .messages import ClaimedMessage, Runner
from .signals import task_finished

if TYPE_CHECKING:
    from .testing_topics import GroupPumps

#: Pause between two looks at the queue while ``wait_seconds`` waits for a retry.
WAIT_STEP_SECONDS = 0.05

__all__ = ["AttemptOutcome", "DrainResult", "drain", "immediate"]


@dataclasses.dataclass(frozen=True)
class AttemptOutcome:
    """One attempt ``drain()`` made."""

    message_id: int
    task_name: str
    attempt: int
    #: ``succeeded``, ``retried`` (failed, will run again), ``failed`` (failed, now dead),
    #: ``deferred`` (no such task in this process: given back), or ``lost``.
    outcome: str
    #: What the attempt raised, or why it could not run; None when it succeeded.
    error: BaseException | None


@dataclasses.dataclass(frozen=True)
class DrainResult:
    """What ``drain()`` ran, attempt by attempt, in order."""

    outcomes: tuple[AttemptOutcome, ...]

    @property
    def processed(self) -> int:
        """Attempts made (a message retried within the drain counts once per attempt)."""
        return len(self.outcomes)

    @property
    def succeeded(self) -> int:
        return self._count("succeeded")

    @property
    def failed(self) -> int:
        """Attempts that raised: retried ones and those that made their message dead."""
        return self._count("retried") + self._count("failed")

    @property
    def retried(self) -> int:
        return self._count("retried")

    @property
    def dead(self) -> int:
        """Messages that went dead (their last attempt failed, or they could not run)."""
        return self._count("failed")

    @property
    def errors(self) -> list[BaseException]:
        return [item.error for item in self.outcomes if item.error is not None]

    def _count(self, outcome: str) -> int:
        return sum(1 for item in self.outcomes if item.outcome == outcome)

    def __str__(self) -> str:
        return (f"{self.processed} attempt(s): {self.succeeded} succeeded, {self.retried} "
                f"retried, {self.dead} dead")


def drain(queues: Sequence[str] | None = None, *, max_messages: int | None = None,
          raise_errors: bool = True, wait_seconds: float = 0.0) -> DrainResult:
    """Run the queued messages in this process, one at a time, until none is ready.

    Topic messages are delivered to this process's consumer groups as a worker does
    (their rows made at their ``start`` before any offset is given, so a ``latest`` group
    gets what had no offset yet; then pumped when nothing else is ready), and the
    deliveries run like any message. Broadcast handlers are not run.

    ``queues``: a list of the queues to take from, in that order (default: every queue holding
    messages, and every group's); a group is delivered to when its queue,
    ``group:<group>``, is among them. Paused queues are left alone, as a worker leaves
    them. ``max_messages``:
    stop after that many attempts. ``wait_seconds``: also wait for scheduled messages
    (retries, delays) that fall due within that many seconds, and run them; rate-limited
    messages run at their limit's pace, so draining several needs ``wait_seconds`` too.
    ``raise_errors``: once the drain is over, raise the first error an attempt met (the
    task's own exception, or ``UnknownTask`` / ``QueueError`` for a message that could
    not run), with the drain's summary as a note; False only returns it in the result.

    Works in ``transactional_db`` / ``TransactionTestCase`` tests, and inside a plain
    ``TestCase`` (pytest-django's ``db``): there the messages enqueued by the test are
    uncommitted, but on this same connection, so they are claimed, run and acked inside
    the test's transaction and rolled back with it. Not inside your own
    ``transaction.atomic()`` block: a claim is made in autocommit.
    """
    from . import routing
    from .checks import queue_vendor
    from .worker.executor import execute

    if isinstance(queues, (str, bytes)):  # else each of its letters would be a queue
        name = queues.decode(errors="replace") if isinstance(queues, bytes) else queues
        raise TypeError(f"drain() takes a list of queue names, e.g. [{name!r}], not the "
                        f"string {queues!r}.")
    conf = get_settings()
    # Each database that holds the queues asked for (every queue database by default),
    # in turn: a queue placed on another alias is drained there, as its worker would.
    aliases = (list(routing.queue_aliases()) if queues is None
               else list(routing.group_by_alias(queues)))
    for alias in aliases:
        if queue_vendor(alias) != "mysql":
            raise QueueError(
                f"drain() runs the real queue, but the queue database {alias!r} is not "
                "MySQL/MariaDB. On other databases use the test mode, MYSQLQ['IMMEDIATE'] "
                "(django_mysqlq.testing.immediate()).")
    from .testing_topics import GroupPumps

    # The consumer groups to deliver to: their queues live on the topics' database.
    pumps = GroupPumps(conf.DATABASE, queues) if conf.DATABASE in aliases else None
    if pumps is not None and not pumps.specs:
        pumps = None
    runner = Runner(worker_id=f"drain:{socket.gethostname()}:{os.getpid()}:"
                              f"{uuid.uuid4().hex[:8]}",
                    host=socket.gethostname(), pid=os.getpid(),
                    thread=threading.current_thread().name)
    give_up = threading.Event()
    deadline = time.monotonic() + wait_seconds
    outcomes: list[AttemptOutcome] = []
    with _errors_of_this_thread() as errors:
        while max_messages is None or len(outcomes) < max_messages:
            waiting = False
            for alias in aliases:
                with routing.on_alias(alias):
                    message, pending = _claim_one(alias, queues, runner, conf, deadline,
                                                  pumps if alias == conf.DATABASE else None)
                    if message is None:
                        waiting = waiting or pending
                        continue
                    errors.clear()
                    outcome = execute(message, runner, give_up)
                    error = errors.get(message.id) or _why_not_run(
                        message.id, message.task_name, outcome)
                outcomes.append(AttemptOutcome(message.id, message.task_name,
                                               message.attempt, outcome, error))
                break
            else:
                if not waiting:
                    break
                time.sleep(min(WAIT_STEP_SECONDS, max(0.0, deadline - time.monotonic())))
    result = DrainResult(tuple(outcomes))
    first = next((item.error for item in outcomes if item.error is not None), None)
    if raise_errors and first is not None:
        first.add_note(f"django_mysqlq.testing.drain(): {result}; pass raise_errors=False "
                       "to get the result instead.")
        raise first
    return result


def _claim_one(alias: str, queues: Sequence[str] | None, runner: Runner, conf: Any,
               deadline: float, pumps: GroupPumps | None = None
               ) -> tuple[ClaimedMessage | None, bool]:
    """One message of ``alias``'s queues (claimed for ``runner``), or None and whether a
    scheduled one falls due before ``deadline`` (worth waiting for). With nothing to
    claim, ``pumps`` turns the topics' messages into deliveries first, as a worker's
    pump does, and the claim looks again."""
    from . import broker

    broker.promote_due(alias=alias)
    paused = broker.paused_queues(alias)
    names = _names(alias, queues, paused)
    claimed = _take(names, runner, conf, alias)
    if not claimed and pumps is not None and pumps.pump():
        names = _names(alias, queues, paused)  # (its queues may hold messages only now)
        claimed = _take(names, runner, conf, alias)
    if claimed:
        return claimed[0], False
    remaining = deadline - time.monotonic()
    return None, bool(names) and remaining > 0 and broker.has_pending(names, remaining)


def _names(alias: str, queues: Sequence[str] | None, paused: set[str]) -> list[str]:
    """The queues to claim from on ``alias``: those asked for (default: every queue
    holding messages), less the paused ones."""
    from . import broker, routing

    return [name for name in (queues if queues is not None else broker.queue_names())
            if name not in paused and routing.alias_for_queue(name) == alias]


def _take(names: list[str], runner: Runner, conf: Any, alias: str) -> list[ClaimedMessage]:
    from . import broker

    if not names:
        return []
    claimed = broker.claim(names, 1, runner.worker_id, conf.LEASE_SECONDS, alias)
    if not claimed:  # rate-limited messages, at their keys' pace
        claimed = broker.claim_throttled(names, 1, runner.worker_id, conf.LEASE_SECONDS,
                                         alias)
    return claimed


@contextmanager
def _errors_of_this_thread() -> Iterator[dict[int, BaseException]]:
    """The exceptions ``task_finished`` reports on this thread, by message id."""
    errors: dict[int, BaseException] = {}
    thread = threading.get_ident()

    def receive(sender: Any, message_id: int, error: BaseException | None = None,
                **kwargs: Any) -> None:
        if error is not None and threading.get_ident() == thread:
            errors[message_id] = error

    uid = f"django_mysqlq.testing.drain:{uuid.uuid4().hex}"
    task_finished.connect(receive, weak=False, dispatch_uid=uid)
    try:
        yield errors
    finally:
        task_finished.disconnect(dispatch_uid=uid)


def _why_not_run(message_id: int, task_name: str, outcome: str) -> BaseException | None:
    """An error for a message that failed without running (no task_finished was sent)."""
    from .handles import read_state

    if outcome == "deferred":
        return UnknownTask(
            f"Message #{message_id} names the task {task_name!r}, which is not registered "
            "in this process; it was given back for later. Import its module (an installed "
            "app's tasks.py, or MYSQLQ['TASK_MODULES']).")
    if outcome != "failed":
        return None
    try:
        reason = read_state(message_id).last_error
    except MessageDoesNotExist:
        reason = "unknown"
    return QueueError(f"Message #{message_id} ({task_name}) could not run and is dead: "
                      f"{reason}")


def immediate(*, raise_errors: bool = True) -> override_settings:
    """``override_settings`` with the test mode on: a context manager, or a decorator of
    a test function or test class. ``raise_errors=False`` keeps a task's exception in
    its handle's state (and the log) instead of raising it in the enqueuing code."""
    current = getattr(settings, "MYSQLQ", {})
    return override_settings(MYSQLQ={**current, "IMMEDIATE": True,
                                     "IMMEDIATE_RAISE": raise_errors})
