"""Operators and topics: looking messages up, and where each went.

A **lookup** reads at most :data:`LOOKUP_MAX` messages along an index (offset, key or
publish time); its **trace** reads the messages' deliveries (``mysqlq_topic_delivery``
by offset), their current rows in the queue and their attempts (``mysqlq_attempt`` by
``message_id``): which groups handled it, when, on which worker, with which outcome.
A group whose position has passed an offset without a delivery of it on record is
named too (:func:`without_delivery`), with why: else the trace would say nothing of it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from ..models import ATTEMPT_OUTCOMES
from .base import (
    ATTEMPT_TABLE,
    MESSAGE_TABLE,
    aware_utc,
    connection_for,
    default_alias,
    naive_utc,
    placeholders,
)
from .topic_ops import DELIVERY_TABLE, GROUP_TABLE, LATEST
from .topics import OFFSET_INDEX, TOPIC_MESSAGE_TABLE

#: Messages one lookup returns at most (a wider range says "more").
LOOKUP_MAX = 1000
#: Past every offset (a BIGINT's largest): "below it" is no bound.
OFFSET_END = 2**63 - 1

_MESSAGE_COLUMNS = "id, topic, msg_offset, msg_key, payload, published_at, sequenced_at"
BY_OFFSET_SQL = (f"SELECT {_MESSAGE_COLUMNS} FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
                 f"({OFFSET_INDEX}) WHERE topic = %s AND msg_offset >= %s AND msg_offset <= %s "
                 "ORDER BY msg_offset LIMIT %s")
#: A key's messages, newest first, below an offset (``--before-offset``: the next page).
BY_KEY_SQL = (f"SELECT {_MESSAGE_COLUMNS} FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
              "(mysqlq_tmsg_key) WHERE topic = %s AND msg_key = %s AND msg_offset IS NOT NULL "
              "AND msg_offset < %s ORDER BY msg_offset DESC LIMIT %s")
#: The same published in [since, until): the key's index range, its rows filtered.
BY_KEY_AND_TIME_SQL = (f"SELECT {_MESSAGE_COLUMNS} FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
                       "(mysqlq_tmsg_key) WHERE topic = %s AND msg_key = %s "
                       "AND msg_offset IS NOT NULL AND msg_offset < %s AND published_at >= %s "
                       "AND published_at < %s ORDER BY msg_offset DESC LIMIT %s")
BY_TIME_SQL = (f"SELECT {_MESSAGE_COLUMNS} FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
               "(mysqlq_tmsg_published) WHERE topic = %s AND published_at >= %s "
               "AND published_at < %s AND msg_offset IS NOT NULL "
               "ORDER BY published_at, id LIMIT %s")
#: The same after one message (``--since T --after-id ID``: the next page): those published
#: at T with a larger id, then the later ones. Paging on the publish time alone repeated
#: every message of an instant (a publish_many() gives up to 1,000 rows one time).
BY_TIME_AFTER_SQL = (f"SELECT {_MESSAGE_COLUMNS} FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
                     "(mysqlq_tmsg_published) WHERE topic = %s AND published_at >= %s "
                     "AND published_at < %s AND msg_offset IS NOT NULL "
                     "AND (published_at > %s OR id > %s) "
                     "ORDER BY published_at, id LIMIT %s")
TRACE_DELIVERIES_SQL = f"""
SELECT message_id, group_name, msg_offset, created_at, replay FROM {DELIVERY_TABLE}
 WHERE topic = %s AND msg_offset IN ({{offsets}}) ORDER BY msg_offset, group_name, message_id
"""
TRACE_CURRENT_SQL = f"""
SELECT id, status, attempts, max_attempts, worker_id, claimed_at, run_at
  FROM {MESSAGE_TABLE} WHERE id IN ({{ids}})
"""
TRACE_ATTEMPTS_SQL = f"""
SELECT message_id, id, attempt, outcome, started_at, finished_at, worker_id, host, pid,
       error_class, error_message, actor
  FROM {ATTEMPT_TABLE} FORCE INDEX (mysqlq_att_message)
 WHERE message_id IN ({{ids}}) ORDER BY message_id, id
"""

TRACE_GROUPS_SQL = f"""
SELECT group_name, start, position, created_at, moved_forward_at, moved_forward_by
  FROM {GROUP_TABLE}
 WHERE topic = %s ORDER BY group_name
"""

#: What the trace says of a group past an offset with no delivery of it on record.
STARTED_AFTER = "never delivered: the group started after it (start latest)"
LINK_MISSING = "no delivery record (its link row is missing)"
MOVED_OR_MISSING = ("no delivery record: its position was moved past it by {by} at {at} "
                    "(a reset forward skips offsets), or its link row is missing")


# ------------------------------------------------------------------ lookup and trace


@dataclasses.dataclass(frozen=True)
class TopicMessageRow:
    id: int
    topic: str
    offset: int | None
    key: str | None
    payload: str
    published_at: dt.datetime
    sequenced_at: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class Lookup:
    messages: list[TopicMessageRow]
    #: More messages matched than ``limit``: narrow the range.
    truncated: bool


def _rows(cursor: Any) -> list[TopicMessageRow]:
    return [TopicMessageRow(int(r[0]), str(r[1]), None if r[2] is None else int(r[2]), r[3],
                            str(r[4]), aware_utc(r[5]) or r[5], aware_utc(r[6]))
            for r in cursor.fetchall()]


def lookup(topic: str, *, offset: int | None = None, to_offset: int | None = None,
           key: str | None = None, since: dt.datetime | None = None,
           until: dt.datetime | None = None, before_offset: int | None = None,
           after_id: int | None = None, limit: int = 100,
           alias: str | None = None) -> Lookup:
    """Messages of ``topic`` by offset (or an offset range to ``to_offset``), by key
    (newest first; only those below ``before_offset`` and/or published in [since, until)
    when given), or published in [since, until) in (publish time, id) order (with
    ``after_id``, only those after the message of that id published at ``since``: the
    next page): at most ``limit`` (≤ LOOKUP_MAX), each one index range read."""
    if not 1 <= limit <= LOOKUP_MAX:
        raise ValueError(f"A lookup returns 1 to {LOOKUP_MAX} messages (--limit), not "
                         f"{limit}.")
    timed = since is not None or until is not None
    if (offset is not None) == (key is not None or timed):  # one way: offset, or the others
        raise ValueError("Look messages up by one of: an offset (--offset), a key (--key, "
                         "with --since/--until or --before-offset to go back further) or a "
                         "time range (--since and/or --until).")
    if before_offset is not None and key is None:
        raise ValueError("--before-offset pages through a key's messages: give --key too.")
    if after_id is not None and (key is not None or since is None):
        raise ValueError("--after-id pages through a time range: give --since too (the "
                         "publish time of that message), without --key (a key's messages "
                         "page with --before-offset).")
    low = since or dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    high = until or dt.datetime(9999, 1, 1, tzinfo=dt.UTC)
    below = OFFSET_END if before_offset is None else before_offset
    with connection_for(alias or default_alias()).cursor() as cursor:
        if offset is not None:
            end = offset if to_offset is None else to_offset
            cursor.execute(BY_OFFSET_SQL, [topic, offset, end, limit + 1])
        elif key is not None and timed:
            cursor.execute(BY_KEY_AND_TIME_SQL, [topic, key, below, naive_utc(low),
                                                 naive_utc(high), limit + 1])
        elif key is not None:
            cursor.execute(BY_KEY_SQL, [topic, key, below, limit + 1])
        elif after_id is not None:
            cursor.execute(BY_TIME_AFTER_SQL, [topic, naive_utc(low), naive_utc(high),
                                               naive_utc(low), after_id, limit + 1])
        else:
            cursor.execute(BY_TIME_SQL, [topic, naive_utc(low), naive_utc(high), limit + 1])
        found = _rows(cursor)
    return Lookup(found[:limit], len(found) > limit)


@dataclasses.dataclass(frozen=True)
class AttemptRow:
    id: int
    attempt: int
    outcome: str
    started_at: dt.datetime | None
    finished_at: dt.datetime
    worker_id: str
    host: str
    pid: int | None
    error: str
    actor: str


@dataclasses.dataclass
class DeliveryTrace:
    """One delivery of a message to a group: its queue message and attempts."""

    message_id: int
    group: str
    offset: int
    created_at: dt.datetime
    #: Its row in the queue now (None: finished and gone, see the attempts).
    status: str | None = None
    worker_id: str = ""
    attempts: list[AttemptRow] = dataclasses.field(default_factory=list)
    #: When a scheduled delivery (a retry) runs next; None otherwise.
    next_try_at: dt.datetime | None = None
    #: Made by an operator's replay (its link row says so), not by the pump.
    replay: bool = False

    @property
    def last_error(self) -> str:
        """The error of its last run when that run failed (retried, failed, lost): what a
        scheduled retry or a dead delivery is waiting on; '' otherwise."""
        runs = self.runs
        return runs[-1].error if runs and runs[-1].outcome != "succeeded" else ""

    @property
    def outcome(self) -> str:
        """``succeeded`` / ``cancelled`` …, or the status while it is in the queue."""
        if self.status is not None:
            return self.status
        return self.attempts[-1].outcome if self.attempts else "unknown"

    @property
    def runs(self) -> list[AttemptRow]:
        """The attempts a worker ran (succeeded, retried, failed, lost): not the history
        rows of operator actions (requeued, cancelled, …) or of a message given back."""
        return [row for row in self.attempts if row.outcome in ATTEMPT_OUTCOMES]

    @property
    def actions(self) -> list[AttemptRow]:
        """The other history rows: operator actions (requeued, cancelled by hand or by a
        reset, …), a message given back by a worker that didn't know its task."""
        return [row for row in self.attempts if row.outcome not in ATTEMPT_OUTCOMES]

    @property
    def handled_by(self) -> str:
        """The worker of the last attempt (or the one running it)."""
        if self.status == "claimed":
            return self.worker_id
        for row in reversed(self.attempts):
            if row.worker_id:
                return row.worker_id
        return ""

    @property
    def handled_at(self) -> dt.datetime | None:
        """When its last run ended (an operator's later requeue does not move it); with
        no run (cancelled before any), its last history row's time."""
        rows = self.runs or self.attempts
        return rows[-1].finished_at if rows else None


def trace(topic: str, offsets: Sequence[int],
          alias: str | None = None) -> dict[int, list[DeliveryTrace]]:
    """The deliveries of these offsets of ``topic`` to every group (replays too), each
    with its current status and attempts, by offset."""
    result: dict[int, list[DeliveryTrace]] = {int(o): [] for o in offsets}
    if not result:
        return result
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(TRACE_DELIVERIES_SQL.format(offsets=placeholders(len(result))),
                       [topic, *result])
        deliveries = {int(r[0]): DeliveryTrace(int(r[0]), str(r[1]), int(r[2]),
                                               aware_utc(r[3]) or r[3], replay=bool(r[4]))
                      for r in cursor.fetchall()}
        if deliveries:
            ids = list(deliveries)
            cursor.execute(TRACE_CURRENT_SQL.format(ids=placeholders(len(ids))), ids)
            for r in cursor.fetchall():
                delivery = deliveries[int(r[0])]
                delivery.status, delivery.worker_id = str(r[1]), str(r[4] or "")
                if delivery.status == "scheduled":
                    delivery.next_try_at = aware_utc(r[6])
            cursor.execute(TRACE_ATTEMPTS_SQL.format(ids=placeholders(len(ids))), ids)
            for r in cursor.fetchall():
                error = f"{r[9]}: {r[10]}" if r[9] else str(r[10] or "")
                deliveries[int(r[0])].attempts.append(AttemptRow(
                    int(r[1]), int(r[2]), str(r[3]), aware_utc(r[4]), aware_utc(r[5]) or r[5],
                    str(r[6] or ""), str(r[7] or ""), None if r[8] is None else int(r[8]),
                    error, str(r[11] or "")))
    for delivery in deliveries.values():
        result[delivery.offset].append(delivery)
    return result


@dataclasses.dataclass(frozen=True)
class NoDelivery:
    """A group whose position has passed an offset with no delivery of it on record."""

    group: str
    reason: str


def without_delivery(topic: str, sequenced: dict[int, dt.datetime | None],
                     traces: dict[int, list[DeliveryTrace]],
                     alias: str | None = None) -> dict[int, list[NoDelivery]]:
    """For each offset of ``sequenced`` (offset: when it got it), the groups past it that
    ``traces`` shows no delivery of it to, each with why: a ``latest`` group made after
    the offset was given never had it (a replay or a reset since does not change that);
    a reset that moved the group forward after it (``moved_forward_at``: a replay or a
    reset backwards skips nothing and is not recorded there) may have skipped it; else
    its link row (``mysqlq_topic_delivery``) is gone, and with it the way to its
    delivery's history: the trace says so rather than nothing."""
    result: dict[int, list[NoDelivery]] = {offset: [] for offset in sequenced}
    if not result:
        return result
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(TRACE_GROUPS_SQL, [topic])
        rows = cursor.fetchall()
    for name, start, position, created, moved, moved_by in rows:
        created_at, moved_at = aware_utc(created), aware_utc(moved)
        for offset, sequenced_at in sequenced.items():
            if int(position) < offset or any(d.group == name for d in traces.get(offset, [])):
                continue
            if start == LATEST and _since(created_at, sequenced_at):
                reason = STARTED_AFTER
            elif _since(moved_at, sequenced_at):
                reason = MOVED_OR_MISSING.format(by=moved_by or "an operator",
                                                 at=f"{moved_at:%Y-%m-%d %H:%M:%S} UTC")
            else:
                reason = LINK_MISSING
            result[offset].append(NoDelivery(str(name), reason))
    return result


def _since(moment: dt.datetime | None, sequenced_at: dt.datetime | None) -> bool:
    """Whether ``moment`` came at or after the offset was given (unknown: no, so the
    trace never says "never delivered" on a guess)."""
    return moment is not None and sequenced_at is not None and moment >= sequenced_at
