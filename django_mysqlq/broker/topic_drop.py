"""Operators and topics: retiring (dropping) a consumer group.

A **drop** ends a group for good, in one transaction under the group's row lock (a
member's pump takes that lock with ``SKIP LOCKED``, so it skips a round and then finds no
row): its *waiting* deliveries (ready, scheduled, blocked) and its *dead* ones (its dead
letter: requeued later they would run for no group) are cancelled (history keeps them,
note :data:`DROP_NOTE`), its delivery links (``mysqlq_topic_delivery``) are deleted in
batches of :data:`LINK_BATCH`, and its row last. A delivery already running finishes (its
ack needs no link). With no row the group no longer holds retention back, and with no
link a group subscribed again under its name starts at its own ``start``; a member still
running its subscription makes it again that way, with a warning.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import DatabaseError

from ..log import one_line
from ..topicnames import delivery_task_name
from . import subjects
from .base import LOCK_ERRORS, MESSAGE_TABLE, default_alias, error_code, in_transaction, logger
from .operate import Operator, cancel_within
from .topic_ops import DELIVERY_TABLE, GROUP_TABLE
from .topic_reset import lock_group

#: The history note of the deliveries a drop cancels.
DROP_NOTE = "topic group dropped"
#: The statuses of the deliveries a drop cancels: waiting (a delivery is never
#: rate-limited, 'throttled' is for completeness) and dead.
WAITING = ("ready", "scheduled", "blocked", "throttled")
DROPPED_STATUSES = (*WAITING, "dead")
#: Link rows deleted a statement.
LINK_BATCH = 5000

#: The group's deliveries a drop cancels, and their status.
DROPPED_DELIVERIES_SQL = f"""
SELECT id, status FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_task)
 WHERE task_name = %s AND status IN ('ready', 'scheduled', 'blocked', 'throttled', 'dead')
"""
#: The group's deliveries running now (left to finish).
RUNNING_DELIVERIES_SQL = f"""
SELECT COUNT(*) FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_task)
 WHERE task_name = %s AND status = 'claimed'
"""
#: A batch of the group's links, oldest offset first (as retention deletes them).
DELETE_LINKS_SQL = (f"DELETE FROM {DELIVERY_TABLE} WHERE topic = %s AND group_name = %s "
                    "ORDER BY msg_offset LIMIT %s")
DELETE_GROUP_SQL = f"DELETE FROM {GROUP_TABLE} WHERE id = %s"


class DropIncomplete(ValueError):
    """The drop's transaction failed (a lock wait, on the group's row or after it): all of
    it was rolled back, the group is as it was. Running it again drops the group."""


@dataclasses.dataclass(frozen=True)
class DropResult:
    topic: str
    group: str
    #: Its position when dropped.
    position: int
    #: Waiting deliveries cancelled (ready, scheduled, blocked).
    cancelled_waiting: int
    #: Dead deliveries cancelled (its dead letter).
    cancelled_dead: int
    #: Delivery link rows deleted.
    links_deleted: int
    #: Deliveries running when it was dropped: left to finish.
    running: int

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def drop_group(topic: str, group: str, operator: Operator,
               alias: str | None = None) -> DropResult:
    """Retire the group (see the module's note). Raises :class:`LookupError` for a group
    without a row, :class:`DropIncomplete` when its transaction failed."""
    alias = alias or default_alias()
    task_name = delivery_task_name(topic, group)
    promoted: list[tuple[int, str]] = []
    begun: list[bool] = []

    def body(cursor: Any) -> DropResult:
        begun.clear()
        group_id, position = lock_group(
            cursor, topic, group, f"Topic {topic!r} has no consumer group {group!r}: nothing "
            "to drop (see queuetopic groups; a group dropped already has no row).")
        begun.append(True)
        cursor.execute(DROPPED_DELIVERIES_SQL, [task_name])
        found = {int(i): str(status) for i, status in cursor.fetchall()}
        cancelled, promoted[:] = cancel_within(cursor, alias, list(found), operator,
                                               note=DROP_NOTE, statuses=DROPPED_STATUSES)
        cursor.execute(RUNNING_DELIVERIES_SQL, [task_name])
        running = int(cursor.fetchone()[0])
        dead = sum(1 for i in cancelled if found[i] == "dead")
        links = 0
        while True:
            cursor.execute(DELETE_LINKS_SQL, [topic, group, LINK_BATCH])
            links += int(cursor.rowcount)
            if int(cursor.rowcount) < LINK_BATCH:
                break
        cursor.execute(DELETE_GROUP_SQL, [group_id])
        return DropResult(topic, group, position, len(cancelled) - dead, dead, links,
                          running)

    try:
        done = in_transaction(alias, body)
    except DatabaseError as exc:
        if not begun and error_code(exc) not in LOCK_ERRORS:
            raise  # (before the row lock: a lock wait there is the same as one after it)
        text = (f"Consumer group {group!r} of topic {topic!r} was not dropped: its "
                f"transaction failed ({one_line(str(exc))}), so nothing changed. Run the "
                "same drop again.")
        logger.error("%s", text)
        raise DropIncomplete(text) from exc
    subjects.wake_promoted(alias, promoted)
    logger.warning("Consumer group %r of topic %r dropped by %s at position %d: %d waiting "
                   "and %d dead deliveries cancelled, %d delivery links deleted, %d running "
                   "left to finish.", group, topic, operator.name, done.position,
                   done.cancelled_waiting, done.cancelled_dead, done.links_deleted,
                   done.running)
    return done
