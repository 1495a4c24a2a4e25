"""Consumer groups: their rows, and the pump that turns topic messages into deliveries.

A delivery is an ordinary queue message (queue ``group:<group>``, task
``topic:<topic>:<group>``): claimed, acked, retried, dead and recovered like any other.
The pump takes the group's row lock (``SKIP LOCKED``: one member pumps at a time, the
others go on claiming), reads the sequenced messages after the group's position, inserts
them as deliveries with their ``mysqlq_topic_delivery`` links, and moves the position, all
in one transaction: each offset becomes a delivery of each group exactly once. A look
(one autocommit statement) comes first, so a round with nothing to do opens no
transaction; a group that has every sequenced message may stamp its topic's new ones
in that same transaction (``pump_group(sequence=True)``, see ``topics.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db import DatabaseError

from ..messages import NewMessage
from ..models import MessageStatus
from ..signals import topic_pumped
from ..topicnames import delivery_task_name
from .base import (
    MESSAGE_TABLE,
    connection_for,
    default_alias,
    in_transaction,
    logger,
    send_robust,
)
from .enqueue import gate_statuses, insert_rows
from .operate import Operator, requeue
from .park import wake
from .topics import (
    OFFSET_INDEX,
    READ_AFTER_SQL,
    SEQUENCE_BATCH,
    TOPIC_MESSAGE_TABLE,
    TOPIC_TABLE,
    sequence_round,
)

GROUP_TABLE = "mysqlq_topic_group"
DELIVERY_TABLE = "mysqlq_topic_delivery"
#: The queue's claim index (``models.CLAIM_INDEX``): counts a group's ready deliveries.
CLAIM_INDEX = "mysqlq_msg_claim"

#: Create a group where it has no row yet: latest starts after the last offset given
#: out, earliest before the first one kept.
CREATE_GROUP_SQL = (
    f"INSERT IGNORE INTO {GROUP_TABLE} (topic, group_name, queue, start, position, "
    "created_at, changed_by) SELECT %s, %s, %s, %s, COALESCE((SELECT IF(%s = 'earliest', "
    f"first_offset - 1, last_offset) FROM {TOPIC_TABLE} WHERE name = %s), 0), "
    "UTC_TIMESTAMP(6), ''"
)
#: The pump's lock: one member at a time; the others skip it.
LOCK_GROUP_SQL = (f"SELECT id, position FROM {GROUP_TABLE} WHERE topic = %s AND group_name = %s"
                  " FOR UPDATE SKIP LOCKED")
#: The pump's look before its transaction (autocommit, no lock): whether the group is
#: behind its topic's last offset, its ready deliveries counted up to the window, and
#: (only when it is not behind: the look walks the offset index's NULL end, slow while
#: purge lags behind the stamping) whether committed messages lack an offset.
#: Most looks of a busy member end here, one statement instead of a transaction.
LOOK_SQL = (
    f"SELECT g.position < t.last_offset, (SELECT COUNT(*) FROM (SELECT 1 FROM {MESSAGE_TABLE}"
    f" FORCE INDEX ({CLAIM_INDEX}) WHERE queue = %s AND status = 'ready' LIMIT %s) AS waiting),"
    f" g.position >= t.last_offset AND EXISTS(SELECT 1 FROM {TOPIC_MESSAGE_TABLE}"
    f" FORCE INDEX ({OFFSET_INDEX}) WHERE topic = g.topic AND msg_offset IS NULL)"
    f" FROM {GROUP_TABLE} g JOIN {TOPIC_TABLE} t ON t.name = g.topic"
    " WHERE g.topic = %s AND g.group_name = %s"
)
#: The next sequenced messages after the group's position.
_LINK_ROW = "(%s, %s, %s, %s, UTC_TIMESTAMP(6))"
LINK_SQL = (f"INSERT INTO {DELIVERY_TABLE} (message_id, topic, group_name, msg_offset, "
            "created_at) VALUES {rows}")
MOVE_SQL = (f"UPDATE {GROUP_TABLE} SET position = %s, pumped_at = UTC_TIMESTAMP(6) "
            "WHERE id = %s")
#: A group's position (None: no such group).
POSITION_SQL = f"SELECT position FROM {GROUP_TABLE} WHERE topic = %s AND group_name = %s"
#: Dead deliveries of one group and topic (its dead letter), oldest first.
DEAD_DELIVERIES_SQL = (
    f"SELECT m.id FROM {MESSAGE_TABLE} m FORCE INDEX (mysqlq_msg_task) "
    "WHERE m.task_name = %s AND m.status = 'dead' ORDER BY m.id LIMIT %s"
)


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """What the pump needs of a group subscription."""

    topic: str
    group: str
    queue: str
    task_name: str
    #: ``hold`` or ``skip``: the gate mode of keyed deliveries.
    on_dead: str
    max_attempts: int
    retry_backoff: float
    timeout: float | None
    start: str = "latest"


def create_group(spec: GroupSpec, alias: str | None = None) -> None:
    """Give the group a row (and its position) unless it has one."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(CREATE_GROUP_SQL, [spec.topic, spec.group, spec.queue, spec.start,
                                          spec.start, spec.topic])


def position(topic: str, group: str, alias: str | None = None) -> int | None:
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(POSITION_SQL, [topic, group])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def _payload(value: str, offset: int, key: str | None, published_at: dt.datetime) -> str:
    """The delivery's task payload: the message's JSON as the one argument (not parsed
    again: a row changed by hand into bad JSON fails its delivery, not the pump)."""
    if published_at.tzinfo is None:
        published_at = published_at.replace(tzinfo=dt.UTC)
    meta = json.dumps({"offset": offset, "key": key, "published_at": published_at.isoformat()})
    return f'{{"args":[{value}],"kwargs":{meta}}}'


def delivery(spec: GroupSpec, row: Sequence[Any]) -> NewMessage:
    """The delivery of one topic row ``(offset, key, payload JSON, published_at)``."""
    offset, key, value, published_at = int(row[0]), row[1], str(row[2]), row[3]
    return NewMessage(
        task_name=spec.task_name, queue=spec.queue, priority=0,
        payload=_payload(value, offset, key, published_at), run_at=None, delay=0.0,
        max_attempts=spec.max_attempts, retry_backoff=spec.retry_backoff,
        timeout=spec.timeout, dedup_key=None,
        # One ordered subject per key and topic within the group's queue.
        gate_key=None if key is None else f"{spec.topic}:{key}",
        gate_mode=None if key is None else spec.on_dead,
        gate_limit=None if key is None else 1,
    )


def pump(spec: GroupSpec, batch: int, window: int, alias: str | None = None,
         least: int = 1) -> int:
    """Turn up to ``batch`` messages after the group's position into deliveries; return
    how many. Nothing when another member is pumping, or ``window`` deliveries wait, or
    deliveries wait and there is room for fewer than ``least`` more (a draining member
    then pumps one big batch now and then, not a few rows every round)."""
    return pump_group(spec, batch, window, alias, least).made


class Pumped(NamedTuple):
    """What :func:`pump_group` did."""

    #: Deliveries made.
    made: int
    #: The group was behind its topic's last offset (False: it had every sequenced
    #: message; only sequencing gives it more).
    behind: bool
    #: Another caller held the topic's sequencing lock: look again shortly (its commit
    #: wakes nobody).
    busy: bool = False


def pump_group(spec: GroupSpec, batch: int, window: int, alias: str | None = None,
               least: int = 1, sequence: bool = False, keep: int = 0) -> Pumped:
    """:func:`pump`, saying whether the group was behind. With ``sequence``, a group that
    is not behind while committed messages of its topic lack an offset stamps them and
    pumps them in one transaction (the group's row, then the topic's, both ``SKIP
    LOCKED``: one fsync and no wait on the way from a publish to its delivery).

    The window is the look's count: two members pumping one after the other off the same
    look may pass it by one batch. ``keep``: deliveries the caller claims itself right
    after (a member that pumped one message wakes no other member for it)."""
    alias = alias or default_alias()
    with connection_for(alias).cursor() as cursor:
        cursor.execute(LOOK_SQL, [spec.queue, window, spec.topic, spec.group])
        look = cursor.fetchone()
    if look is None:
        return Pumped(0, False)  # no such group
    if look[0] is None or look[1] is None:
        # A producer's wake-up (KILL QUERY) that lands in the look's subquery can make
        # MariaDB answer NULL instead of error 1317 (seen in a chaos run): nothing is
        # known, so say "behind" and the worker looks again instead of parking.
        return Pumped(0, True)
    behind, waiting, unsequenced = bool(look[0]), int(look[1]), bool(look[2])
    if waiting >= window or (waiting and window - waiting < least):
        return Pumped(0, behind)
    wanted = min(batch, window - waiting)
    if behind:
        return Pumped(_pump(spec, wanted, alias, keep=keep), True)
    if not (sequence and unsequenced):
        return Pumped(0, False)
    made = _pump(spec, wanted, alias, sequence_first=True, keep=keep)
    return Pumped(max(made, 0), False, busy=made < 0)


def _pump(spec: GroupSpec, wanted: int, alias: str, sequence_first: bool = False,
          keep: int = 0) -> int:
    """The pump's transaction: up to ``wanted`` deliveries; -1 when ``sequence_first``
    found the topic's row held."""

    def body(cursor: Any) -> tuple[int, list[str]]:
        cursor.execute(LOCK_GROUP_SQL, [spec.topic, spec.group])
        row = cursor.fetchone()
        if row is None:
            return 0, []
        group_id, current = int(row[0]), int(row[1])
        if sequence_first:
            # The sequencer's own round (topic row, then its consistent read): the
            # offsets it gives stay a gap-free prefix; this transaction sees its stamps.
            stamped = sequence_round(cursor, spec.topic, SEQUENCE_BATCH, skip_locked=True)
            if stamped is None:
                return -1, []
        cursor.execute(READ_AFTER_SQL, [spec.topic, current, wanted])
        rows = cursor.fetchall()
        if not rows:
            return 0, []
        messages = [delivery(spec, found) for found in rows]
        statuses = gate_statuses(cursor, messages)
        ids = insert_rows(alias, messages, statuses)
        params: list[Any] = []
        for message_id, found in zip(ids, rows, strict=True):
            params.extend((message_id, spec.topic, spec.group, int(found[0])))
        cursor.execute(LINK_SQL.format(rows=", ".join([_LINK_ROW] * len(ids))), params)
        last = int(rows[-1][0])
        cursor.execute(MOVE_SQL, [last, group_id])
        ready = [m.queue for m, status in zip(messages, statuses, strict=True)
                 if status != MessageStatus.BLOCKED]
        return len(rows), ready

    pumped, queues = in_transaction(alias, body)
    if pumped > 0:
        try:
            if queues[keep:]:
                wake(queues[keep:], alias)
        except DatabaseError as exc:  # the deliveries are committed; members poll them
            logger.warning("Could not wake the members of group %r (%s).", spec.group, exc)
        send_robust(topic_pumped, spec.topic, group=spec.group, count=pumped)
    return pumped


def dead_deliveries(topic: str, group: str, limit: int = 1000,
                    alias: str | None = None) -> list[int]:
    """Ids of the group's dead deliveries of ``topic`` (its dead letter), oldest first."""
    return dead_deliveries_by_task(delivery_task_name(topic, group), limit, alias)



def requeue_dead(task_name: str, operator: Operator, ids: Sequence[int] | None = None, *,
                 reset_attempts: bool = False) -> list[int]:
    """Requeue dead deliveries of one group and topic (``ids``, or its whole dead letter,
    1,000 at a time); return the ids requeued. Each gets one more attempt, or a full set
    with ``reset_attempts``; the history says who did it."""
    if ids is None:
        done: list[int] = []
        while batch := dead_deliveries_by_task(task_name):
            requeued = requeue(batch, operator, reset_attempts=reset_attempts,
                               statuses=(MessageStatus.DEAD,))
            done.extend(requeued)
            if not requeued:
                break
        return done
    return requeue(list(ids), operator, reset_attempts=reset_attempts,
                   statuses=(MessageStatus.DEAD,))


def dead_deliveries_by_task(task_name: str, limit: int = 1000,
                            alias: str | None = None) -> list[int]:
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(DEAD_DELIVERIES_SQL, [task_name, limit])
        return [int(row[0]) for row in cursor.fetchall()]
