"""Operators and topics: resetting a group's position.

A **reset** moves a group's position under the group's row lock (the pump takes that
lock with ``SKIP LOCKED``, so it simply skips a round) and records who and when. The
group's *waiting* deliveries (ready, scheduled, blocked) are cancelled together in that
transaction (history keeps them, note :data:`RESET_NOTE`): none is claimed or promoted
after the move. Each offset past the new position becomes exactly one new delivery: a
reset backwards does not run the waiting ones twice. A cancelled delivery of an offset at
or before the new position is skipped for good (the target is the next offset the group
gets): the result counts them (:attr:`ResetResult.skipped`) and names their offsets, and
the log line says so, for an operator to replay them if they should run. A delivery
already running finishes; dead ones stay in the dead letter.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.db import DatabaseError

from ..log import one_line
from ..topicnames import delivery_task_name
from . import subjects
from .base import (
    LOCK_ERRORS,
    MESSAGE_TABLE,
    default_alias,
    error_code,
    in_transaction,
    logger,
    naive_utc,
)
from .kept import kept_bounds
from .operate import Operator, cancel_within
from .topic_ops import DELIVERY_TABLE, EARLIEST, GROUP_TABLE, LATEST, TARGET_NAMES, TopicOffsetError
from .topics import TOPIC_MESSAGE_TABLE

#: The history note of the waiting deliveries a reset cancels.
RESET_NOTE = "topic group reset"
#: The statuses of the deliveries a reset cancels.
WAITING = ("ready", "scheduled", "blocked")


class ResetIncomplete(ValueError):
    """A reset's transaction gave up on a lock (a lock wait or a deadlock, after
    ``in_transaction``'s retries: on the group's row, the topic's kept bounds, or while
    cancelling its waiting deliveries): the whole reset was rolled back, the position is
    where it was. The message says to run it again, and what holds it up if it fails
    again."""


LOCK_GROUP_SQL = (f"SELECT id, position FROM {GROUP_TABLE} WHERE topic = %s AND group_name = %s"
                  " FOR UPDATE")
#: The first message published at or after a time (along mysqlq_tmsg_published), and
#: when it was sequenced.
OFFSET_AT_TIME_SQL = f"""
SELECT msg_offset, sequenced_at FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX (mysqlq_tmsg_published)
 WHERE topic = %s AND published_at >= %s AND msg_offset IS NOT NULL
 ORDER BY published_at, id LIMIT 1
"""
#: The lowest offset of the messages published in a span. Offsets follow commits, and
#: ``published_at`` is the insert's time: a message published later than the first one
#: of the span, in a shorter transaction, may have the lower offset. Each such message
#: was published before that first one was sequenced, which bounds the span.
LOWEST_OFFSET_PUBLISHED_SQL = f"""
SELECT MIN(msg_offset) FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX (mysqlq_tmsg_published)
 WHERE topic = %s AND published_at >= %s AND published_at <= %s AND msg_offset IS NOT NULL
"""
#: The group's waiting deliveries and the offset each delivers (from its link row; NULL
#: when retention deleted its message and its links while it waited: its offset is
#: before the first kept one, so before any position a reset can set).
WAITING_DELIVERIES_SQL = f"""
SELECT m.id, d.msg_offset FROM {MESSAGE_TABLE} m FORCE INDEX (mysqlq_msg_task)
  LEFT JOIN {DELIVERY_TABLE} d ON d.message_id = m.id
 WHERE m.task_name = %s AND m.status IN ('ready', 'scheduled', 'blocked')
"""
#: (A move forward is recorded apart, set before ``position`` changes: a trace blames only
#: it for a skipped offset. Params: new position thrice, operator, operator, group id.)
MOVE_GROUP_SQL = (f"UPDATE {GROUP_TABLE} SET moved_forward_at = IF(%s > position, "
                  "UTC_TIMESTAMP(6), moved_forward_at), moved_forward_by = IF(%s > position, "
                  "%s, moved_forward_by), position = %s, changed_at = UTC_TIMESTAMP(6), "
                  "changed_by = %s, pump_problem = '', pump_problem_at = NULL WHERE id = %s")



@dataclasses.dataclass(frozen=True)
class ResetTarget:
    """Where to move a group: ``to_offset`` (the next offset it gets), ``to_time`` (the
    first message published at or after it), or ``earliest`` / ``latest``."""

    to_offset: int | None = None
    to_time: dt.datetime | None = None
    edge: str | None = None

    def __post_init__(self) -> None:
        given = [self.to_offset is not None, self.to_time is not None, self.edge is not None]
        if sum(given) != 1:
            raise ValueError("Give exactly one of: an offset, a time, earliest or latest.")
        if self.edge is not None and self.edge not in (EARLIEST, LATEST):
            raise ValueError(f"Reset to 'earliest' or 'latest', not {self.edge!r}.")
        if self.to_time is not None and self.to_time.tzinfo is None:
            raise ValueError("A reset time needs a time zone (UTC if none is meant).")

    def describe(self) -> str:
        if self.to_offset is not None:
            return f"offset {self.to_offset}"
        if self.to_time is not None:
            return f"time {self.to_time.isoformat()}"
        return str(self.edge)


@dataclasses.dataclass(frozen=True)
class ResetResult:
    topic: str
    group: str
    old_position: int
    new_position: int
    #: Waiting deliveries cancelled, all of them: those of offsets past the new position
    #: come again (the pump delivers each such offset once more); the others are
    #: :attr:`skipped`.
    cancelled: int
    #: A reset to a time at or after which no message (with an offset) was published yet:
    #: the group was set to the latest offset, and gets what is published from now on.
    none_at_or_after_time: bool = False
    #: Of :attr:`cancelled`, those of offsets at or before the new position: they will
    #: not run (the group's next offset is past them) unless an operator replays them.
    skipped: int = 0
    #: The lowest and highest offset of the :attr:`skipped` (None: none skipped, or none
    #: with an offset left).
    skipped_offsets: tuple[int, int] | None = None
    #: Some offsets between those two were not skipped (handled, running, dead): a replay
    #: of the range runs them again too.
    skipped_gaps: bool = False
    #: Of :attr:`skipped`, those whose message retention deleted (their link with it):
    #: no offset to name, nothing to replay.
    skipped_gone: int = 0

    def skipped_words(self) -> str:
        """The skipped, in words for the log ("" if none): how many, before which
        offset, and their offsets."""
        if not self.skipped:
            return ""
        where = []
        if self.skipped_offsets is not None:
            first, last = self.skipped_offsets
            where.append(f"offset {first}" if first == last else
                         f"offsets {first}-{last}"
                         + (", not every one between" if self.skipped_gaps else ""))
        if self.skipped_gone:
            where.append(f"{self.skipped_gone} whose message retention deleted")
        return (f"{self.skipped} of them ({'; '.join(where)}) "
                f"{'is' if self.skipped == 1 else 'are'} before offset "
                f"{self.new_position + 1}, the next one the group gets, and will not run "
                "unless replayed")


def _offsets_to(first: int, last: int) -> str:
    """The offsets a reset may target, in words."""
    if first > last:  # nothing kept
        return f"to offset {last + 1} (only new messages)"
    return f"to an offset from {first} to {last + 1} ({last + 1}: only new messages)"


def _new_position(cursor: Any, topic: str, target: ResetTarget,
                  names: dict[str, str]) -> tuple[int, bool]:
    """The new position, and whether a time target found no message (the latest then)."""
    # Under a shared lock: a retention batch deleting offsets this reset may target
    # commits first (the reset then sees them gone) or waits for this one (and then
    # sees the group's new position: see topic_retention.py).
    first, last = kept_bounds(cursor, topic, locking=True) or (1, 0)
    if target.edge == EARLIEST:
        return first - 1, False
    if target.edge == LATEST:
        return last, False
    if target.to_time is not None:
        since = naive_utc(target.to_time)
        cursor.execute(OFFSET_AT_TIME_SQL, [topic, since])
        found = cursor.fetchone()
        if found is None:
            return last, True  # nothing published since: the group gets what comes next
        lowest = int(found[0])
        if found[1] is not None:  # (None: changed by hand; that message's offset, then)
            cursor.execute(LOWEST_OFFSET_PUBLISHED_SQL, [topic, since, found[1]])
            lowest = min(lowest, int(cursor.fetchone()[0] or lowest))
        return max(lowest, first) - 1, False
    offset = int(target.to_offset or 0)
    earliest = (f"Reset to {names[EARLIEST]}, or {_offsets_to(first, last)}."
                if first <= last else f"Reset {_offsets_to(first, last)}.")
    if offset < 1:
        deleted = ""
        if first > 1:
            kept = "the earliest kept" if first <= last else "none is kept"
            deleted = f", and retention deleted the messages before offset {first} ({kept})"
        raise TopicOffsetError(
            f"Topic {topic!r} has no offset {offset}: offsets start at 1{deleted}. "
            f"{earliest}")
    if offset < first:
        kept = "the earliest kept" if first <= last else "none is kept"
        raise TopicOffsetError(
            f"Topic {topic!r} no longer keeps offset {offset}: retention deleted the "
            f"messages before offset {first} ({kept}). {earliest}")
    if offset > last + 1:
        raise TopicOffsetError(
            f"Topic {topic!r} has no offset {offset} yet: its last offset is {last}. Reset "
            f"{_offsets_to(first, last)}, or to {names[LATEST]}.")
    return offset - 1, False


def lock_group(cursor: Any, topic: str, group: str, missing: str) -> tuple[int, int]:
    """The group's id and position, its row locked for an operator's transaction (reset,
    drop); :class:`LookupError` saying ``missing`` when it has no row."""
    cursor.execute(LOCK_GROUP_SQL, [topic, group])
    row = cursor.fetchone()
    if row is None:
        raise LookupError(missing)
    return int(row[0]), int(row[1])


def reset_group(topic: str, group: str, target: ResetTarget, operator: Operator,
                alias: str | None = None, *,
                names: dict[str, str] | None = None) -> ResetResult:
    """Move the group's position so that the next message it gets is ``target``'s; cancel
    its waiting deliveries (see the module's note). Raises :class:`LookupError` for an
    unknown group, :class:`TopicOffsetError` for an offset the topic doesn't keep (its
    message names the other targets as ``names`` says: :data:`TARGET_NAMES` if None)."""
    alias = alias or default_alias()
    task_name = delivery_task_name(topic, group)
    said = names or TARGET_NAMES
    none_found = False
    cancelling: list[int] = []  # how many waiting, once the cancel began
    promoted: list[tuple[int, str]] = []
    offsets: dict[int, int | None] = {}  # each waiting delivery's offset

    def body(cursor: Any) -> tuple[int, int, list[int]]:
        nonlocal none_found
        cancelling.clear()
        group_id, old = lock_group(
            cursor, topic, group, f"Topic {topic!r} has no consumer group {group!r} (a group "
            "is created by the first worker that runs its handler).")
        new, none_found = _new_position(cursor, topic, target, said)
        cursor.execute(WAITING_DELIVERIES_SQL, [task_name])
        offsets.clear()
        offsets.update((int(found[0]), None if found[1] is None else int(found[1]))
                       for found in cursor.fetchall())
        waiting = list(offsets)
        who = operator.name[:200]
        cursor.execute(MOVE_GROUP_SQL, [new, new, who, new, who, group_id])
        cancelling.append(len(waiting))  # here: once it commits none is claimable any more
        cancelled, promoted[:] = cancel_within(cursor, alias, waiting, operator,
                                               note=RESET_NOTE, statuses=WAITING)
        return old, new, cancelled

    try:
        old, new, cancelled = in_transaction(alias, body)
    except DatabaseError as exc:
        if cancelling:
            text = (f"Consumer group {group!r} of topic {topic!r} was not reset: its "
                    f"{cancelling[0]} waiting deliveries could not be cancelled "
                    f"({one_line(str(exc))}), so nothing changed: its position stays where "
                    "it was. Run the same reset again. If it fails again, another "
                    "transaction holds some of those deliveries or their keys' gates (a long "
                    "transaction that publishes or acks, or a session left open: SHOW ENGINE "
                    "INNODB STATUS shows it): end it, or stop the group's workers for a "
                    "moment, and run the reset then.")
        elif error_code(exc) in LOCK_ERRORS:  # on the group's row or the topic's bounds
            text = (f"Consumer group {group!r} of topic {topic!r} was not reset: its "
                    f"transaction gave up on a lock ({one_line(str(exc))}), so nothing "
                    "changed: its position stays where it was. Run the same reset again. If "
                    "it fails again, another transaction holds the group's row (another "
                    "reset, replay or drop of the group) or its topic's row (a retention "
                    "batch of the topic): SHOW ENGINE INNODB STATUS shows it; run the reset "
                    "once it ends.")
        else:
            raise
        logger.error("%s", text)
        raise ResetIncomplete(text) from exc
    subjects.wake_promoted(alias, promoted)
    done = _result(topic, group, old, new, [offsets.get(i) for i in cancelled], none_found)
    skipped = done.skipped_words()
    logger.warning("Consumer group %r of topic %r reset to %s by %s: position %d -> %d; "
                   "%d waiting deliveries cancelled%s.", group, topic, target.describe(),
                   operator.name, old, new, done.cancelled, f": {skipped}" if skipped else "")
    return done


def _result(topic: str, group: str, old: int, new: int, cancelled: list[int | None],
            none_found: bool) -> ResetResult:
    """The result of a reset that cancelled deliveries of these offsets (None: its
    message deleted by retention, so before any position it could be set to)."""
    skipped = [offset for offset in cancelled if offset is None or offset <= new]
    kept = sorted({offset for offset in skipped if offset is not None})
    bounds = (kept[0], kept[-1]) if kept else None
    return ResetResult(topic, group, old, new, len(cancelled), none_found,
                       skipped=len(skipped), skipped_offsets=bounds,
                       skipped_gaps=bool(kept) and len(kept) != kept[-1] - kept[0] + 1,
                       skipped_gone=skipped.count(None))
