"""A worker's topic and group rows, made at its start without waiting behind a lock.

A member makes its topics' rows (``mysqlq_topic``) and its groups' (``mysqlq_topic_group``)
where they are missing. The ``INSERT`` waits for a stranger's lock on the table (a
transaction left open after ``SELECT … FOR UPDATE``) up to ``innodb_lock_wait_timeout``
(50 s), again and again: the worker did not start, served none of its other groups and
queues, and heard its stop only when the statement ended. So each row is made under
``UPKEEP_LOCK_WAIT_SECONDS`` (2 s); one that can't be is logged, naming the table, and
left for later: the worker starts and serves the rest, and its pumps try the row again
(:meth:`TopicSetup.retry`, every few seconds, up to every :data:`LONGEST_PAUSE`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence

from django.db import DatabaseError

from .. import broker
from ..conf import get_settings
from ..log import one_line
from ..topicnames import LATEST
from .group_trouble import loop_handles

logger = logging.getLogger("django_mysqlq")

#: The first pause before a row left for later is tried again, and the longest.
FIRST_PAUSE = 5.0
LONGEST_PAUSE = 60.0


def sequence_at_start(topic: str, wait: bool = False) -> None:
    """Stamp the topic's waiting messages as a worker starts. One whose stamping fails on
    its own (its ``last_offset`` changed by hand, out of range) must not keep the worker
    from starting: it is logged, and its groups' pumps and readers say it again. With
    ``wait``, a row held by another session (its stamping round: at any of the rounds of
    a backlog) is waited for, up to ``UPKEEP_LOCK_WAIT_SECONDS``: a broadcast reader's
    start and a new group at the latest offset need every waiting message stamped."""
    try:
        if wait:
            _sequence_waiting(topic)
        else:
            broker.try_sequence(topic)
    except DatabaseError as exc:
        if loop_handles(exc):
            raise
        logger.error("Topic %r: its waiting messages could not be given offsets as this "
                     "worker started: %s. The worker starts; the topic's groups and readers "
                     "get no new messages until they can (see manage.py queuetopic groups).",
                     topic, one_line(str(exc)))


def _sequence_waiting(topic: str) -> None:
    """Stamp the topic's messages inserted before now, waiting a bounded time for its row
    at each round (not for later ones: a publisher outpacing the rounds must not keep
    the start from ending)."""
    newest = broker.newest_message_id()
    if not broker.has_unsequenced(topic, up_to_id=newest):
        return  # (a stranger's lock on an idle topic holds up no start)
    seconds = get_settings().UPKEEP_LOCK_WAIT_SECONDS
    try:
        with broker.bounded_lock_waits(seconds):
            broker.sequence(topic, up_to_id=newest)
    except DatabaseError as exc:
        if not broker.is_lock_wait(exc):
            raise
        logger.warning("Topic %r: another session held its row for %d s as this process "
                       "started (a transaction left open? see information_schema.INNODB_TRX)"
                       ": its broadcast subscribers and new groups start at the last offset "
                       "given out, so messages published before the start that get theirs "
                       "later reach them too.", topic, seconds)


def made(make: Callable[[], object]) -> bool:
    """Run ``make`` (an ``INSERT IGNORE`` of a missing row) waiting at most
    ``UPKEEP_LOCK_WAIT_SECONDS`` for a lock; False when another session held it."""
    try:
        with broker.bounded_lock_waits(get_settings().UPKEEP_LOCK_WAIT_SECONDS):
            make()
    except DatabaseError as exc:
        if not broker.is_lock_wait(exc):
            raise
        return False
    return True


def held_advice(table: str) -> str:
    return (f"another session holds a lock on {table} (waited "
            f"{get_settings().UPKEEP_LOCK_WAIT_SECONDS} s: a transaction left open after a "
            "SELECT … FOR UPDATE? see information_schema.INNODB_TRX and end it)")


class TopicSetup:
    """Makes the rows of a worker's topics and groups; keeps those it could not make (a
    lock held on their table) and tries them again now and then."""

    def __init__(self) -> None:
        #: Groups whose row (or whose topic's) is not made yet, and since when (monotonic).
        self.pending: dict[tuple[str, str], broker.GroupSpec] = {}
        self._since = 0.0
        self._next_try = 0.0
        self._pause = FIRST_PAUSE
        #: The topics and groups whose held row was logged (once until it is made).
        self._logged: set[tuple[str, str]] = set()

    def waits(self, spec: broker.GroupSpec) -> bool:
        """Whether the group's row is not made yet (its pump waits for it)."""
        return (spec.topic, spec.group) in self.pending

    def start(self, topic: str, specs: Sequence[broker.GroupSpec]) -> None:
        """Make the topic's row and its groups' where missing (once one was held, the
        rest are left for later without a try: each try may wait its bound)."""
        if self.pending:
            self._leave_untried(topic, specs)
        elif not made(lambda: broker.ensure_topic(topic)):
            if self._first((topic, "")):
                logger.warning(
                    "Topic %r: its row could not be made: %s. The worker starts and serves "
                    "its other groups and queues; groups %s get no deliveries until it is "
                    "made, tried again every %.0f s at most.", topic,
                    held_advice("mysqlq_topic"), ", ".join(repr(spec.group) for spec in specs),
                    LONGEST_PAUSE)
            self._leave(specs)
        else:
            # A group made now at the latest offset begins after the messages committed
            # before it: another process stamping them holds the topic's row, and the
            # offset read before its round ends would hand the group that backlog (so
            # the groups are made right after their topic's wait, not after all of
            # them). Else not waiting: a stranger holding the row must not stop a start.
            sequence_at_start(topic, wait=any(
                spec.start == LATEST and broker.position(topic, spec.group) is None
                for spec in specs))
            for index, spec in enumerate(specs):
                if not made(functools.partial(broker.create_group, spec)):
                    if self._first((topic, spec.group)):
                        logger.warning(
                            "Group %r of topic %r: its row could not be made: %s. The "
                            "worker starts and serves its other groups and queues; this "
                            "group gets no deliveries until its row is made, tried again "
                            "every %.0f s at most.", spec.group, topic,
                            held_advice("mysqlq_topic_group"), LONGEST_PAUSE)
                    self._leave([spec])
                    self._leave_untried(topic, specs[index + 1:])
                    return

    def _leave_untried(self, topic: str, specs: Sequence[broker.GroupSpec]) -> None:
        """Leave for later, without a try, the groups that have no row (those that have
        one are pumped: a plain read says which)."""
        missing = [spec for spec in specs if broker.position(topic, spec.group) is None]
        for spec in missing:
            if self._first((topic, spec.group)):
                logger.warning("Group %r of topic %r: its row is made once the held row "
                               "above is (tried in turn).", spec.group, topic)
        self._leave(missing)

    def _first(self, name: tuple[str, str]) -> bool:
        """Whether a held row is to be logged (once until it is made)."""
        first = name not in self._logged
        self._logged.add(name)
        return first

    def _leave(self, specs: Sequence[broker.GroupSpec]) -> None:
        if specs and not self.pending:
            self._since = time.monotonic()
            self._next_try, self._pause = self._since + FIRST_PAUSE, FIRST_PAUSE
        self.pending.update({(spec.topic, spec.group): spec for spec in specs})

    def retry(self) -> None:
        """Try the rows left for later again, when due: the groups made are pumped from
        now on (logged); a table still held leaves the rest for the next try."""
        now = time.monotonic()
        if not self.pending or now < self._next_try:
            return
        left, since, pause = list(self.pending.values()), self._since, self._pause
        self.pending.clear()
        by_topic: dict[str, list[broker.GroupSpec]] = {}
        for spec in left:
            by_topic.setdefault(spec.topic, []).append(spec)
        for topic, specs in by_topic.items():
            self.start(topic, specs)
        for spec in left:
            if not self.waits(spec):
                self._logged.difference_update({(spec.topic, ""), (spec.topic, spec.group)})
                logger.warning("Group %r of topic %r: its row is made (%.0f s after the "
                               "first try): the lock is gone; the group is pumped from now "
                               "on.", spec.group, spec.topic, now - since)
        if self.pending:
            self._since, self._pause = since, min(pause * 2, LONGEST_PAUSE)
            self._next_try = time.monotonic() + self._pause
