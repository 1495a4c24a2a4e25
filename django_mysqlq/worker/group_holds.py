"""A group's row held by another session: followed, and logged when it lasts.

A member's pump takes its group's row ``SKIP LOCKED``: another member pumping holds it
for milliseconds, and the pump leaves that round to it. A stranger's transaction left
open on the row (``SELECT … FOR UPDATE``) holds it for as long as it stays open: no member
pumps the group meanwhile, and its lag grows. Each member logs such a hold once it has
lasted :data:`HELD_LOG_SECONDS`, and again when the row is free; meanwhile it looks again
after a pause that grows to a second (``TopicDuty.busy_pause``), as for a held topic row,
and a ``--burst`` member waits for it as it waits for any backlog of its groups.
"""

from __future__ import annotations

import logging
import time

from .. import broker

logger = logging.getLogger("django_mysqlq")

#: A row held this long by someone else (a pump or a sequencing round holds it for
#: milliseconds) is a stranger's lock: logged once, and looked at less and less often.
HELD_LOG_SECONDS = 5.0


class GroupHolds:
    """The groups whose row another session held at every pump since (monotonic), and
    those of them logged."""

    def __init__(self) -> None:
        self.since: dict[tuple[str, str], float] = {}
        self.logged: set[tuple[str, str]] = set()

    def note(self, spec: broker.GroupSpec, pumped: broker.Pumped) -> None:
        """Follow the group's row after a pump: held (``group_lock`` False), taken, or
        not tried (the look found nothing to do: while a hold is followed, a probe that
        takes the row and lets it go at once says whether it ended)."""
        name = (spec.topic, spec.group)
        now = time.monotonic()
        if pumped.group_lock is False:
            since = self.since.setdefault(name, now)
            if now - since >= HELD_LOG_SECONDS and name not in self.logged:
                self.logged.add(name)
                logger.warning(
                    "Group %r of topic %r: another session has held its row in "
                    "mysqlq_topic_group for %.0f s (a transaction left open? see "
                    "information_schema.INNODB_TRX): no member can pump the group until it "
                    "ends, so its lag grows (a --burst member waits for it); the worker's "
                    "other groups and queues go on.", spec.group, spec.topic, now - since)
            return
        if name not in self.since:
            return
        if pumped.group_lock is None and not broker.group_row_free(spec.topic, spec.group):
            return
        since = self.since.pop(name)
        if name in self.logged:
            self.logged.discard(name)
            logger.warning("Group %r of topic %r: its row in mysqlq_topic_group is free "
                           "again after %.0f s; its pump goes on.", spec.group, spec.topic,
                           now - since)
