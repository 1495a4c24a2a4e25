"""Replay a range of a topic into one consumer group.

Each offset of the range becomes a **new** delivery of that group only (a queue message
built as the pump builds one, with its ``mysqlq_topic_delivery`` link marked
``replay``), so the trace of the offset lists the original delivery and the replay side
by side. The group's position does not move: replay re-delivers what the group already
had; messages after its position come from the pump as usual. A replayed message with
a key passes the same ordered subject as the group's other deliveries of that key: the
replays of one key run in offset order, after the deliveries of that key already
waiting.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import DatabaseError

from ..log import one_line
from ..models import MessageStatus
from .base import connection_for, default_alias, in_transaction, logger
from .deliveries import GroupSpec, delivery
from .enqueue import gate_statuses, insert_rows
from .kept import kept_bounds
from .operate import Operator
from .oversized import READ_UP_TO_SQL, Oversized, fitting
from .packets import row_room
from .park import wake
from .topic_ops import DELIVERY_TABLE, GROUP_TABLE, TopicOffsetError

#: Offsets one replay takes at most (split a wider range into several replays).
REPLAY_MAX = 100_000
#: Deliveries per transaction.
REPLAY_CHUNK = 500

#: A replay's links say so (``replay``): the trace marks a replay by it, not by an earlier
#: delivery of the offset to the group (a reset backwards makes one too).
_LINK_ROW = "(%s, %s, %s, %s, UTC_TIMESTAMP(6), 1)"
REPLAY_LINK_SQL = (f"INSERT INTO {DELIVERY_TABLE} (message_id, topic, group_name, msg_offset, "
                   "created_at, replay) VALUES {rows}")
GROUP_POSITION_SQL = (f"SELECT id, position FROM {GROUP_TABLE} "
                      "WHERE topic = %s AND group_name = %s")
RECORD_SQL = (f"UPDATE {GROUP_TABLE} SET changed_at = UTC_TIMESTAMP(6), changed_by = %s "
              "WHERE id = %s")


class ReplayIncomplete(ValueError):
    """A replay stopped part-way: the chunks before the failure are committed (their
    deliveries will run); the message says from which offset to resume, not to replay
    the whole range again (that would deliver the committed part a second time)."""


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    topic: str
    group: str
    first: int
    last: int
    #: Deliveries made (one per offset of the range whose message was found).
    replayed: int
    #: The topic's first kept offset once the replay ended, read when offsets of the
    #: range were not found (retention, or a hand delete, removed them meanwhile).
    first_kept: int | None = None

    @property
    def missing(self) -> int:
        """Offsets of the range with no message to replay (no delivery made)."""
        return max(0, self.last - self.first + 1 - self.replayed)


def _check(cursor: Any, spec: GroupSpec, first: int, last: int) -> int:
    """Validate the range against the topic and group; return the group's row id."""
    if first > last:
        raise TopicOffsetError(f"The range {first}..{last} is empty: its first offset must "
                               "be at most its last (--from-offset, --to-offset).")
    if last - first + 1 > REPLAY_MAX:
        raise TopicOffsetError(f"A replay takes at most {REPLAY_MAX:,} offsets, not "
                               f"{last - first + 1:,}: split the range.")
    cursor.execute(GROUP_POSITION_SQL, [spec.topic, spec.group])
    row = cursor.fetchone()
    if row is None:
        raise LookupError(f"Topic {spec.topic!r} has no consumer group {spec.group!r} (a "
                          "group is created by the first worker that runs its handler; "
                          "manage.py queuetopic groups lists them).")
    group_id, position = int(row[0]), int(row[1])
    kept, newest = kept_bounds(cursor, spec.topic) or (1, 0)
    if kept > newest:
        gone = (f"retention deleted offsets 1 to {newest}" if newest
                else "no message of it has an offset yet")
        raise TopicOffsetError(
            f"Topic {spec.topic!r} keeps no message ({gone}): there is nothing to replay.")
    if first < 1:
        deleted = (f", and retention deleted the messages before offset {kept}"
                   if kept > 1 else "")
        raise TopicOffsetError(
            f"Topic {spec.topic!r} has no offset {first}: offsets start at 1{deleted}. "
            f"Replay from {kept}.")
    if first < kept:
        raise TopicOffsetError(
            f"Topic {spec.topic!r} no longer keeps offset {first}: retention deleted the "
            f"messages before offset {kept}. Replay from {kept}.")
    if last > position:
        raise TopicOffsetError(
            f"Group {spec.group!r} is at offset {position} of topic {spec.topic!r}: offsets "
            f"after it have not been delivered yet (they come anyway), so a replay ends at "
            f"{position} at most.")
    return group_id


def replay_range(spec: GroupSpec, first: int, last: int, operator: Operator,
                 alias: str | None = None) -> ReplayResult:
    """New deliveries of offsets ``first``..``last`` of ``spec.topic`` for ``spec.group``
    only, in transactions of :data:`REPLAY_CHUNK`; raises :class:`TopicOffsetError` for
    an empty range, one past the group's position or one retention deleted."""
    alias = alias or default_alias()
    with connection_for(alias).cursor() as cursor:
        group_id = _check(cursor, spec, first, last)
    done = 0
    queues: list[str] = []
    start = first
    room = row_room(alias)
    too_big: list[Oversized] = []

    def body(cursor: Any) -> tuple[int, int, list[str]]:
        too_big.clear()
        cursor.execute(READ_UP_TO_SQL, [room, spec.topic, start - 1, last, REPLAY_CHUNK])
        found = cursor.fetchall()
        # (A message longer than one statement may carry is not read: the replay stops
        # before it, as the pump does, instead of failing the whole chunk.)
        fit = fitting(found, lambda row: delivery(spec, row), room)
        if fit.oversized is not None:
            too_big.append(fit.oversized)
        rows, messages = fit.rows, fit.messages
        if not rows:
            return 0, last, []
        statuses = gate_statuses(cursor, messages)
        ids = insert_rows(alias, messages, statuses)
        params: list[Any] = []
        for message_id, row in zip(ids, rows, strict=True):
            params.extend((message_id, spec.topic, spec.group, int(row[0])))
        cursor.execute(REPLAY_LINK_SQL.format(rows=", ".join([_LINK_ROW] * len(ids))), params)
        cursor.execute(RECORD_SQL, [operator.name[:200], group_id])
        ready = [m.queue for m, status in zip(messages, statuses, strict=True)
                 if status != MessageStatus.BLOCKED]
        return len(rows), int(rows[-1][0]), ready

    try:
        while start <= last:
            count, reached, ready = in_transaction(alias, body)
            done += count
            queues.extend(ready)
            if too_big:
                big = too_big[0]
                _wake(spec, queues, alias)
                raise _incomplete(
                    spec, first, last, operator, done, big.offset, big.offset + 1,
                    f"the delivery of offset {big.offset} takes {big.size} bytes in one "
                    f"statement and the server's max_allowed_packet leaves {big.room} for "
                    "one row (raise it, or leave that offset out)")
            if count < REPLAY_CHUNK:
                break
            start = reached + 1
    except DatabaseError as exc:
        _wake(spec, queues, alias)
        if not done:
            raise  # nothing committed: the error as it is
        raise _incomplete(spec, first, last, operator, done, start, start,
                          one_line(str(exc))) from exc
    _wake(spec, queues, alias)
    result = ReplayResult(spec.topic, spec.group, first, last, done)
    if result.missing:  # deleted since the check (retention), or by hand
        with connection_for(alias).cursor() as cursor:
            kept = kept_bounds(cursor, spec.topic)
        result = dataclasses.replace(result, first_kept=kept[0] if kept else None)
        logger.warning("Replay of offsets %d..%d of topic %r into group %r for %s: %d "
                       "offsets had no message (the topic keeps offsets from %s now).",
                       first, last, spec.topic, spec.group, operator.name, result.missing,
                       result.first_kept)
    logger.warning("Replayed offsets %d..%d of topic %r into group %r for %s: %d "
                   "deliveries.", first, last, spec.topic, spec.group, operator.name, done)
    return result


def _incomplete(spec: GroupSpec, first: int, last: int, operator: Operator, done: int,
                at: int, resume: int, why: str) -> ReplayIncomplete:
    """The error (logged) of a replay that stopped at offset ``at`` after committing
    ``done`` deliveries: it names the offset to resume from."""
    text = (f"Replay of offsets {first}..{last} of topic {spec.topic!r} into group "
            f"{spec.group!r} stopped at offset {at}: {why}. The offsets before it were "
            f"replayed ({done} deliveries, committed; they will run). To finish, replay "
            f"from offset {resume} to {last} once the cause is dealt with; replaying the "
            "whole range again would deliver those a second time.")
    logger.error("%s (by %s)", text, operator.name)
    return ReplayIncomplete(text)


def _wake(spec: GroupSpec, queues: list[str], alias: str) -> None:
    if not queues:
        return
    try:
        wake(queues, alias)
    except DatabaseError as exc:  # committed; members find them at their next round
        logger.warning("Could not wake the members of group %r (%s).", spec.group, exc)
