"""A member's view of its groups whose pump can't go on, and what it does about them.

Two kinds of trouble stop a group's pump while the worker's other groups and queues go
on: its pump *fails* (a row changed by hand, a value out of range: the server refuses a
statement), or it *stops* before a message it can't deliver (too big). (A position past
the topic's end no longer stops it: the pump sets it back, see ``broker.group_ahead``.)
Each is logged once per cause, written on the group's row for the
operator (``queuetopic groups``, the admin: ``broker.note_pump_problem``), and a failing
pump is tried again after a pause that doubles up to :data:`LONGEST_PAUSE` rather than at
every round (every 20 ms on a busy worker).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import DatabaseError

from .. import broker
from ..broker.base import CONNECTION_LOST
from ..broker.oversized import Oversized
from ..log import Failures, one_line
from ..signals import topic_group_stopped

logger = logging.getLogger("django_mysqlq")

#: A failing pump is tried again after this pause, doubled at each failure up to the
#: longest one (a lock it gave up on, 1205/1213, is tried at the next round).
FIRST_PAUSE = 0.5
LONGEST_PAUSE = 5.0

GroupName = tuple[str, str]
#: The server going away (shutdown in progress, the connection killed, or gone and lost:
#: ``CONNECTION_LOST``): the loop's outage, even when the session still answers a ping
#: just after.
OUTAGE_ERRORS = CONNECTION_LOST | {1053, 1927}


def loop_handles(exc: DatabaseError) -> bool:
    """Whether ``exc`` is the worker loop's to handle, not one topic's or group's: no
    connection left or the server going away, the schema or a grant missing (everything
    else would fail the same way), or a wake-up's ``KILL QUERY`` (the loop just goes
    round again)."""
    return (broker.error_code(exc) in OUTAGE_ERRORS or broker.is_schema_error(exc)
            or broker.is_setup_error(exc) or broker.was_interrupted(exc)
            or broker.connection_lost())


class GroupTrouble:
    """The groups of one worker whose pump fails or stopped, and since when."""

    def __init__(self) -> None:
        #: Groups whose pump fails on their own: they wait, the others go on.
        self.failing: Failures[GroupName] = Failures()
        #: Groups stopped by a row only an operator can fix, logged once per cause: to
        #: the offset of a message too big for its delivery.
        self.stopped: dict[GroupName, int] = {}
        #: Failing groups' next try (monotonic) and their failures in a row.
        self._next_try: dict[GroupName, float] = {}
        self._in_a_row: dict[GroupName, int] = {}

    def resting(self, spec: broker.GroupSpec, now: float) -> bool:
        """Whether the group's failing pump waits out its pause this round."""
        return now < self._next_try.get((spec.topic, spec.group), 0.0)

    def wedged(self, spec: broker.GroupSpec) -> bool:
        """Whether the group's pump has failed for more than a lock since it last made
        deliveries: a ``--burst`` member ends without waiting for it (a lock it gave up
        on passes, so it still waits for such a group)."""
        return any(code not in broker.LOCK_ERRORS
                   for _, code in self.failing.kinds((spec.topic, spec.group)))

    def waits_for_operator(self, spec: broker.GroupSpec) -> bool:
        return (spec.topic, spec.group) in self.stopped or self.wedged(spec)

    def failed(self, spec: broker.GroupSpec, exc: Exception) -> bool:
        """Whether the other groups can be pumped past this group's failure (then logged,
        once per group and kind of error, and noted on its row). Not when the loop
        handles it (:func:`loop_handles`). An error that is no database error (a row
        changed by hand into a value the pump can't take) is the group's own."""
        if isinstance(exc, DatabaseError) and loop_handles(exc):
            return False
        name = (spec.topic, spec.group)
        code = broker.error_code(exc)
        if code not in broker.LOCK_ERRORS:
            in_a_row = self._in_a_row.get(name, 0) + 1
            self._in_a_row[name] = in_a_row
            self._next_try[name] = time.monotonic() + min(
                LONGEST_PAUSE, FIRST_PAUSE * 2 ** (in_a_row - 1))
        if self.failing.failed(name, exc):
            text = one_line(str(exc) if isinstance(exc, DatabaseError)
                            else f"{type(exc).__name__}: {exc}")
            logger.error(
                "Group %r of topic %r: its pump failed: %s. The worker's other groups and "
                "queues go on; this group gets no new deliveries until it pumps again, "
                "tried every %.0f s at most (said again only for a new kind of error). A "
                "row of mysqlq_topic, mysqlq_topic_group or mysqlq_topic_message changed by "
                "hand is the usual cause: see manage.py queuetopic groups and lookup.",
                spec.group, spec.topic, text, LONGEST_PAUSE)
            self._note(spec, f"its pump failed: {text}")
        return True

    def pumped(self, spec: broker.GroupSpec, pumped: broker.Pumped) -> None:
        """The group's pump ran without error: log and note where it stopped, if it did
        (once per cause), or that it pumps again."""
        name = (spec.topic, spec.group)
        self._next_try.pop(name, None)
        self._in_a_row.pop(name, None)
        if pumped.oversized is not None:
            self._stopped_at(spec, pumped.oversized)
        elif pumped.made or pumped.ahead is not None:
            self.stopped.pop(name, None)
        # (Not just no error: a pump that found the row held tried nothing. Its move of
        # the position cleared the note on the group's row.)
        if pumped.made and self.failing.recovered(name):
            logger.warning("Group %r of topic %r pumps again.", spec.group, spec.topic)
        if pumped.noted and self._caught_up(pumped):
            self._clear(spec)

    @staticmethod
    def _caught_up(pumped: broker.Pumped) -> bool:
        """Whether the group has every sequenced message and its pump stopped at nothing:
        no note of a problem holds then (a row fixed by hand left nothing to move)."""
        return not (pumped.behind or pumped.busy or pumped.made or pumped.ahead is not None
                    or pumped.oversized is not None)

    def _clear(self, spec: broker.GroupSpec) -> None:
        """Take the note off the group's row (a failure to is only logged: the next look
        tries again)."""
        self.stopped.pop((spec.topic, spec.group), None)
        if _on_row(spec, "could not clear the note of its pump's problem on its row",
                   lambda: broker.clear_pump_problem(spec.topic, spec.group)):
            logger.warning("Group %r of topic %r has every message up to its topic's last "
                           "offset: its pump goes on; the note of its problem is cleared.",
                           spec.group, spec.topic)

    def _stopped_at(self, spec: broker.GroupSpec, oversized: Oversized) -> None:
        """Log and note a group stopped before a message too big for its delivery, once
        per message."""
        name = (spec.topic, spec.group)
        if self.stopped.get(name) == oversized.offset:
            return
        self.stopped[name] = oversized.offset
        described = oversized.describe(spec.topic, spec.group)
        logger.error("%s", described)
        self._note(spec, described)

    def _note(self, spec: broker.GroupSpec, problem: str) -> None:
        """Signal the problem and write it on the group's row (a failure to write it is
        only logged)."""
        broker.send_robust(topic_group_stopped, spec.topic, group=spec.group, problem=problem)
        _on_row(spec, "could not note its problem on its row",
                lambda: broker.note_pump_problem(spec.topic, spec.group, problem),
                then="; the log above says it")


def _on_row(spec: broker.GroupSpec, failing: str, write: Callable[[], bool],
            then: str = "") -> bool:
    """``write()`` to the group's row; a failure of its own is logged (``failing``) and
    gives False, the loop's (the server gone, the schema) is raised."""
    try:
        return write()
    except DatabaseError as exc:
        if loop_handles(exc):
            raise
        logger.warning("Group %r of topic %r: %s (%s)%s.", spec.group, spec.topic, failing,
                       one_line(str(exc)), then)
        return False
