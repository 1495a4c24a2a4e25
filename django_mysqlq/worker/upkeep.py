"""The control loop's housekeeping, made to give way to a lock another session holds.

Retention, the repairs, the promotion of due messages and the recurring schedules run on
the control connection, between the claims, heartbeats and recovery sweeps. A stranger
holding a table (``LOCK TABLES mysqlq_rate WRITE``, a long ``ALTER TABLE``) or a row in
an open transaction used to stop that loop for as long as the server let the statement
wait (a day, for a metadata lock): no claims here, and, on the recovery leader, no
recovery for the whole fleet. Here each step waits at most
``MYSQLQ['UPKEEP_LOCK_WAIT_SECONDS']`` (``broker.bounded_lock_waits``); on a lock-wait
timeout it is skipped for this round with one warning and tried again the next round.
A step that fails on its own (a row changed by hand, a value out of range) is logged once
per kind of error and the round's next steps go on: one broken step used to end the whole
upkeep of every round, on the leader the retention and repairs after it and the promotion
of due messages too. Only a failure that leaves no connection (or a missing table) still
ends the round, for the loop's own handling of database trouble.

:class:`RateWatch` does the same for the rate keys' table on the claim path: while a
stranger holds it, the worker claims and runs plain messages and leaves throttled ones.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from django.db import DatabaseError

from .. import broker
from ..broker.base import GATE_TABLE, SCHEDULE_TABLE, SCHEMA_ERRORS, error_code
from ..broker.park import RATE_TABLE
from ..broker.topics import TOPIC_MESSAGE_TABLE, TOPIC_TABLE
from ..log import Failures, one_line
from ..messages import ClaimedMessage
from . import retention, schedules, topic_retention

logger = logging.getLogger("django_mysqlq")

T = TypeVar("T")

#: First and longest pause before a worker tries the locked rate keys' table again (each
#: try may hold its loop up for the lock wait).
RATE_RETRY_FIRST = 5.0
RATE_RETRY_LONGEST = 60.0


class Housekeeping:
    """Runs the upkeep's housekeeping steps with bounded lock waits, one round at a time."""

    def __init__(self, worker_id: str, lock_wait: int) -> None:
        self.worker_id = worker_id
        self.lock_wait = lock_wait
        #: Tables found locked this round: later steps on them are skipped without a wait.
        self._locked: set[str] = set()
        #: Steps whose last run failed: logged once per kind of error (and on the
        #: worker's row: ``troubles``).
        self.failing: Failures[str] = Failures()

    @contextlib.contextmanager
    def _round(self) -> Iterator[None]:
        """One round: the session's lock waits lowered for it, and restored after."""
        self._locked = set()
        with broker.bounded_lock_waits(self.lock_wait):
            yield

    def step(self, name: str, table: str, run: Callable[[], T]) -> T | None:
        """``run()``, or None when it gave up waiting for a lock on ``table`` (logged once:
        the step is tried again next round)."""
        if table in self._locked:
            self._skipped(name, table)
            return None
        try:
            result = run()
        except DatabaseError as exc:
            if not broker.is_lock_wait(exc):
                if not self._failed_alone(name, exc):
                    raise
                return None
            self._locked.add(table)
            self._skipped(name, table)
            return None
        if self.failing.recovered(name):
            logger.info("Worker %s: upkeep step '%s' works again.", self.worker_id, name)
        return result

    def _failed_alone(self, name: str, exc: DatabaseError) -> bool:
        """Whether the round can go on past this step's failure (then logged, once per
        step and kind of error). Not when the connection is gone or the schema is missing:
        every later step would fail the same way."""
        if error_code(exc) in SCHEMA_ERRORS or broker.connection_lost():
            return False
        if broker.was_interrupted(exc):
            # KILL QUERY: a producer's wake-up that came while this step ran, not a park.
            # Nothing is wrong with the step; the next round runs it.
            logger.debug("Worker %s: upkeep step '%s' was interrupted by a wake-up; it runs "
                         "again next round.", self.worker_id, name)
            return True
        if self.failing.failed(name, exc):
            logger.error("Worker %s: upkeep step '%s' failed: %s. The round's other steps "
                         "go on; this one is tried again next round (said again only for a "
                         "new kind of error).", self.worker_id, name, one_line(str(exc)))
        return True

    def _skipped(self, name: str, table: str) -> None:
        logger.warning("Worker %s: upkeep step '%s' skipped: %s is locked by another session "
                       "(lock wait timeout %d s); retrying next round.", self.worker_id, name,
                       table, self.lock_wait)

    def leader_round(self, host: str, pid: int, stale_seconds: float) -> None:
        """The recovery leader's housekeeping: stale workers, retention, the repairs."""
        with self._round():
            self.step("stale worker marking", broker.WORKER_TABLE, broker.mark_stale_workers)
            # Old dead messages, worker rows, expired unique keys, idle rate keys.
            retention.prune(self.worker_id, host, pid, step=self.step)
            self.step("sequencing of unread topics", TOPIC_TABLE,
                      topic_retention.sequence_unread)
            self.step("topic retention", TOPIC_MESSAGE_TABLE, topic_retention.prune)
            # Gate counters and rate keys' rows changed by hand.
            self.step("gate repair", GATE_TABLE, lambda: broker.repair_gates(stale_seconds))
            self.step("rate key repair", RATE_TABLE, broker.repair_rate_keys)

    def promotion_round(self) -> None:
        """Due scheduled messages become ready; recurring tasks' due occurrences fire."""
        with self._round():
            self.step("promotion of due messages", broker.MESSAGE_TABLE, broker.promote_due)
            self.step("recurring schedules", SCHEDULE_TABLE, schedules.fire)


class RateWatch:
    """Whether the rate keys' table can be read now: a worker whose code has rate-limited
    tasks reads it on every claim and park, and a stranger's lock on it must not hold up
    its plain claims. While the table is locked the worker leaves throttled messages and
    tries the table again after a growing pause (logged once per lock episode)."""

    def __init__(self, worker_id: str, lock_wait: int) -> None:
        self.worker_id = worker_id
        self.lock_wait = lock_wait
        self._until = 0.0
        self._pause: float | None = None
        #: When the current lock episode began (UTC), for the worker's row; None: none.
        self.locked_since: dt.datetime | None = None

    def usable(self) -> bool:
        """Not known to be locked (or time to try it again)."""
        return time.monotonic() >= self._until

    def locked(self) -> None:
        """A read of the table gave up waiting: leave it alone for a while."""
        news = self._pause is None
        self._pause = min((self._pause or RATE_RETRY_FIRST / 2) * 2, RATE_RETRY_LONGEST)
        self._until = time.monotonic() + self._pause
        if news:
            self.locked_since = dt.datetime.now(dt.UTC)
            logger.warning("Worker %s: %s is locked by another session (lock wait timeout "
                           "%d s): throttled messages are not claimed until it is free; "
                           "plain messages are. Trying it again now and then.",
                           self.worker_id, RATE_TABLE, self.lock_wait)

    def cleared(self) -> None:
        """A read of the table went through: the lock episode, if any, is over."""
        if self._pause is not None:
            self._pause = None
            self._until = 0.0
            self.locked_since = None
            logger.info("Worker %s: %s is no longer locked; claiming throttled messages "
                        "again.", self.worker_id, RATE_TABLE)

    def claim(self, queues: Sequence[str], limit: int, lease_seconds: float,
              idle: bool) -> list[ClaimedMessage]:
        """The throttled claim, or nothing while the table is locked by a stranger."""
        if not self.usable():
            return []
        try:
            messages = broker.claim_throttled(queues, limit, self.worker_id, lease_seconds,
                                              idle=idle, lock_wait=self.lock_wait)
        except DatabaseError as exc:
            if not broker.is_lock_wait(exc):
                raise
            self.locked()
            return []
        self.cleared()
        return messages

    def next_start(self, queues: Sequence[str], idle: bool) -> float | None:
        """Seconds to a rate key's next start (``broker.seconds_to_next_start``) with a
        message a worker (``idle`` or not) may claim; None while the table is locked."""
        if not self.usable():
            return None
        try:
            return broker.seconds_to_next_start(queues, lock_wait=self.lock_wait, idle=idle)
        except DatabaseError as exc:
            if not broker.is_lock_wait(exc):
                raise
            self.locked()
            return None

    def park(self, queues: Sequence[str], seconds: float, sweep_check: str, rated: bool,
             **kwargs: Any) -> tuple[str, str | None]:
        """``broker.idle_wait``, reading the rate keys only when the table is not locked;
        a park that gave up waiting for it ends at once (``interrupted``), one that read it
        ends the lock episode (an idle worker claims nothing after a park that slept). A
        park cut short before it ran (``interrupted``: a wake-up while it waited for the
        table, say) tells nothing of the table."""
        rates = rated and self.usable()
        try:
            parked = broker.idle_wait(queues, seconds, sweep_check, rates=rates,
                                      lock_wait=self.lock_wait if rates else None, **kwargs)
        except DatabaseError as exc:
            if not (rates and broker.is_lock_wait(exc)):
                raise
            self.locked()
            return "interrupted", None
        if rates and parked[0] != "interrupted":
            self.cleared()
        return parked
