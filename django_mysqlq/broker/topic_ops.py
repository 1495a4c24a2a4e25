"""Operators and topics: a group's position and lag (resets: ``topic_reset``; lookups:
``topic_lookup``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from ..topicnames import delivery_task_name
from .base import (
    MESSAGE_TABLE,
    NOW_SQL,
    aware_utc,
    connection_for,
    default_alias,
    placeholders,
)
from .group_ahead import reset_hint
from .kept import checked_first, kept_bounds
from .topic_repairs import HIGHEST_OFFSET_SQL
from .topics import OFFSET_INDEX, TOPIC_MESSAGE_TABLE, TOPIC_TABLE

GROUP_TABLE = "mysqlq_topic_group"
DELIVERY_TABLE = "mysqlq_topic_delivery"
#: Statuses of a delivery not handled yet (lag).
UNFINISHED = ("ready", "scheduled", "claimed", "blocked")

EARLIEST = "earliest"
LATEST = "latest"
#: How a refused reset names the other targets: the admin's words (its form's choices)
#: unless the caller passes its own (``queuetopic`` passes its options, :data:`CLI_NAMES`).
TARGET_NAMES = {EARLIEST: "the earliest kept message", LATEST: "the latest"}
CLI_NAMES = {EARLIEST: "--earliest", LATEST: "--latest"}


class TopicOffsetError(ValueError):
    """An operator asked for an offset the topic does not have (or no longer keeps)."""



# ------------------------------------------------------------------ statements

GROUPS_SQL = f"""
SELECT g.topic, g.group_name, g.queue, g.start, g.position, g.created_at, g.pumped_at,
       g.changed_at, g.changed_by, COALESCE(t.last_offset, 0), COALESCE(t.first_offset, 1),
       g.pump_problem, g.pump_problem_at
  FROM {GROUP_TABLE} g LEFT JOIN {TOPIC_TABLE} t ON t.name = g.topic
 {{where}}
 ORDER BY g.topic, g.group_name
"""
#: Deliveries of some groups' tasks by status, along mysqlq_msg_task.
DELIVERY_COUNTS_SQL = f"""
SELECT task_name, status, COUNT(*) FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_task)
 WHERE task_name IN ({{names}}) GROUP BY task_name, status
"""
#: The lowest offset among a group's unfinished deliveries, and the lowest id among
#: those without a link row: retention deletes a message and its links once every
#: group's position passed it, even while a delivery of it still waits or retries.
OLDEST_UNFINISHED_SQL = f"""
SELECT MIN(d.msg_offset), MIN(IF(d.message_id IS NULL, m.id, NULL))
  FROM {MESSAGE_TABLE} m FORCE INDEX (mysqlq_msg_task)
  LEFT JOIN {DELIVERY_TABLE} d ON d.message_id = m.id
 WHERE m.task_name = %s AND m.status IN ('ready', 'scheduled', 'claimed', 'blocked')
"""
PUBLISHED_AT_SQL = (f"SELECT published_at FROM {TOPIC_MESSAGE_TABLE} "
                    "WHERE topic = %s AND msg_offset = %s")
#: A group's unfinished delivery of an offset (its message row gone, its link kept).
UNFINISHED_OF_OFFSET_SQL = f"""
SELECT MIN(d.message_id) FROM {DELIVERY_TABLE} d FORCE INDEX (mysqlq_tdel_group)
  JOIN {MESSAGE_TABLE} m ON m.id = d.message_id
 WHERE d.topic = %s AND d.group_name = %s AND d.msg_offset = %s
   AND m.status IN ('ready', 'scheduled', 'claimed', 'blocked')
"""
#: A delivery's offset and publish time as its payload's ``kwargs`` carry them, and its
#: enqueue time. ``JSON_VALID`` first: MySQL's ``JSON_EXTRACT`` fails on a payload changed
#: by hand into bad JSON (MariaDB's says NULL).
DELIVERY_STAMPS_SQL = f"""
SELECT CASE WHEN JSON_VALID(payload) THEN JSON_EXTRACT(payload, '$.kwargs.offset') END,
       CASE WHEN JSON_VALID(payload)
            THEN JSON_UNQUOTE(JSON_EXTRACT(payload, '$.kwargs.published_at')) END,
       enqueued_at
  FROM {MESSAGE_TABLE} WHERE id = %s
"""
#: Unsequenced messages of a topic counted at most: they pile up while every reader of it
#: is down, and a count of them all walked the whole pile at each stats call or dashboard
#: refresh (millions after a long outage). Past it the count says "more than this".
#: Measured with 60,000 waiting: 17 ms for the whole count, 8 ms capped at 20,000 (the
#: capped read keeps its rows in a temporary table: about 0.4 µs a row against 0.3).
UNSEQUENCED_COUNT_CAP = 100_000
#: Committed messages no reader has given an offset yet (none runs while every member of
#: every group and every broadcast subscriber of the topic is down), up to one past the
#: cap (``%s``: the cap + 1), and the lowest id: read from the (topic, offset) index
#: alone, whose NULL offsets come first, in id order (the first entry is the lowest id).
UNSEQUENCED_COUNT_SQL = (f"SELECT COUNT(*), MIN(id) FROM (SELECT id FROM {TOPIC_MESSAGE_TABLE} "
                         f"FORCE INDEX ({OFFSET_INDEX}) WHERE topic = %s AND msg_offset IS NULL "
                         "LIMIT %s) AS capped")
PUBLISHED_BY_ID_SQL = f"SELECT published_at FROM {TOPIC_MESSAGE_TABLE} WHERE id = %s"
# ------------------------------------------------------------------ groups, lag


@dataclasses.dataclass
class GroupState:
    """A consumer group: where it is, and how far behind."""

    topic: str
    group: str
    queue: str
    start: str
    position: int
    created_at: dt.datetime
    pumped_at: dt.datetime | None
    changed_at: dt.datetime | None
    changed_by: str
    last_offset: int
    first_offset: int
    #: Deliveries by status (ready, scheduled, claimed, blocked, dead).
    deliveries: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Offset of the oldest message this group has not handled yet, and its age (the
    #: age alone when that message has no offset yet: see ``unsequenced``).
    oldest_unhandled: int | None = None
    oldest_age_seconds: float | None = None
    #: Messages published to the topic but not given an offset yet: every group of the
    #: topic is behind them (they pile up while no worker reads the topic). Counted up to
    #: :data:`UNSEQUENCED_COUNT_CAP`; ``unsequenced_capped`` when there are more (``lag``
    #: is then a floor, shown as ``100000+``).
    unsequenced: int = 0
    unsequenced_capped: bool = False
    #: Why its pump can't go on, as a member last said, and since when ("" and None: no
    #: problem said; see ``topic_problems``).
    pump_problem: str = ""
    pump_problem_at: dt.datetime | None = None
    #: The topic's end (its last offset, or a higher offset a message has: a counter
    #: lowered by hand) when the position is past it (changed by hand): the next messages
    #: published would get the offsets between and the group would skip them. A member's
    #: pump sets it back (``group_ahead``); None when not past it.
    past_end: int | None = None

    @property
    def task_name(self) -> str:
        return delivery_task_name(self.topic, self.group)

    @property
    def kept_position(self) -> int:
        """Where the group reads on from among the kept messages: its position, or just
        before the first kept offset when retention (not waiting for groups) deleted
        messages it never read (the pump skips them too)."""
        return max(self.position, self.first_offset - 1)

    @property
    def not_pumped(self) -> int:
        """Kept messages after the position: not yet turned into deliveries."""
        return max(0, self.last_offset - self.kept_position)

    @property
    def lag(self) -> int:
        """Messages not handled yet: after the position (or without an offset yet),
        plus unfinished deliveries."""
        return (self.not_pumped + self.unsequenced
                + sum(self.deliveries.get(s, 0) for s in UNFINISHED))

    @property
    def lag_shown(self) -> str:
        """The lag as text: ``123+`` when the unsequenced count stopped at its cap (the
        real lag is more); ``0 (past end)`` when the position is past the topic's end
        (``position_problem`` says what that means)."""
        shown = f"{self.lag}+" if self.unsequenced_capped else str(self.lag)
        return f"{shown} (past end)" if self.past_end is not None else shown

    @property
    def position_problem(self) -> str:
        """What a position past the topic's end means, and its remedy ("" when not)."""
        if self.past_end is None:
            return ""
        end, skipped = self.past_end, self.position - self.past_end
        which = (f"message published (offset {end + 1})" if skipped == 1 else
                 f"{skipped} messages published (offsets {end + 1} to {self.position})")
        return (f"position {self.position} is past the topic's last offset {end} (changed "
                f"by hand?): the next {which} would not reach the group. A member of the "
                f"group sets it back to {end} at its next look, cancelling nothing; with "
                f"none running: {reset_hint(self.topic, self.group, end)}")

    @property
    def dead(self) -> int:
        return self.deliveries.get("dead", 0)

    def as_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "group": self.group, "queue": self.queue,
            "position": self.position, "last_offset": self.last_offset,
            "first_offset": self.first_offset, "lag": self.lag, "dead": self.dead,
            "not_pumped": self.not_pumped, "unsequenced": self.unsequenced,
            "unsequenced_capped": self.unsequenced_capped,
            "deliveries": dict(self.deliveries),
            "oldest_unhandled": self.oldest_unhandled,
            "oldest_age_seconds": self.oldest_age_seconds,
            "changed_at": self.changed_at.isoformat() if self.changed_at else None,
            "changed_by": self.changed_by,
            "pump_problem": self.pump_problem,
            "pump_problem_at": (self.pump_problem_at.isoformat()
                                if self.pump_problem_at else None),
            "past_end": self.past_end is not None,
            "position_problem": self.position_problem,
        }


def groups(topic: str | None = None, group: str | None = None, *,
           lag: bool = True, alias: str | None = None) -> list[GroupState]:
    """Every consumer group (of ``topic``; named ``group``), with its lag unless not
    ``lag``: a few indexed statements per group."""
    clauses, params = [], []
    if topic is not None:
        clauses.append("g.topic = %s")
        params.append(topic)
    if group is not None:
        clauses.append("g.group_name = %s")
        params.append(group)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(GROUPS_SQL.format(where=where), params)
        found = [GroupState(str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]),
                            aware_utc(r[5]) or r[5], aware_utc(r[6]), aware_utc(r[7]), str(r[8]),
                            int(r[9]), int(r[10]), pump_problem=str(r[11] or ""),
                            pump_problem_at=aware_utc(r[12])) for r in cursor.fetchall()]
        firsts: dict[str, int] = {}
        for state in found:  # (a first_offset set by hand past the last: see kept.py)
            if state.topic not in firsts:
                firsts[state.topic] = checked_first(cursor, state.topic, state.first_offset,
                                                    state.last_offset)
            state.first_offset = firsts[state.topic]
        _past_end(cursor, found)
        if not lag or not found:
            return found
        by_task = {state.task_name: state for state in found}
        cursor.execute(DELIVERY_COUNTS_SQL.format(names=placeholders(len(by_task))),
                       list(by_task))
        for task_name, status, count in cursor.fetchall():
            by_task[str(task_name)].deliveries[str(status)] = int(count)
        cursor.execute(NOW_SQL)
        now = aware_utc(cursor.fetchone()[0])
        assert now is not None
        unsequenced = {name: _unsequenced(cursor, name) for name in {s.topic for s in found}}
        for state in found:
            count, first_unsequenced = unsequenced[state.topic]
            state.unsequenced = min(count, UNSEQUENCED_COUNT_CAP)
            state.unsequenced_capped = count > UNSEQUENCED_COUNT_CAP
            found_oldest = _oldest(cursor, state)
            if found_oldest is not None:
                state.oldest_unhandled, published = found_oldest
            else:  # nothing with an offset is waiting: the oldest unhandled has none yet
                published = first_unsequenced
            if published is not None:
                state.oldest_age_seconds = max(0.0, (now - published).total_seconds())
    return found


def _past_end(cursor: Any, found: list[GroupState]) -> None:
    """Mark the groups whose position is past their topic's end: its last offset, or the
    highest offset a message has (read only for those groups, once a topic)."""
    highest: dict[str, int] = {}
    for state in found:
        if state.position <= state.last_offset:
            continue
        if state.topic not in highest:
            cursor.execute(HIGHEST_OFFSET_SQL, [state.topic])
            highest[state.topic] = int(cursor.fetchone()[0] or 0)
        end = max(state.last_offset, highest[state.topic])
        if state.position > end:
            state.past_end = end


def _oldest(cursor: Any, state: GroupState) -> tuple[int | None, dt.datetime | None] | None:
    """The group's oldest unhandled offset (None: unknown) and when it was published (None:
    unknown); None when nothing with an offset is waiting."""
    oldest: int | None = None
    unlinked: tuple[int | None, dt.datetime | None] | None = None
    if any(state.deliveries.get(s, 0) for s in UNFINISHED):
        cursor.execute(OLDEST_UNFINISHED_SQL, [state.task_name])
        row = cursor.fetchone()
        if row is not None and row[0] is not None:
            oldest = int(row[0])
        if row is not None and row[1] is not None:  # its message and link deleted
            unlinked = _delivery_stamps(cursor, int(row[1]))
    if state.not_pumped and (oldest is None or state.kept_position + 1 < oldest):
        oldest = state.kept_position + 1
    if unlinked is not None and (oldest is None or unlinked[0] is None
                                 or unlinked[0] < oldest):
        return unlinked
    if oldest is None:
        return None
    return oldest, _published_at(cursor, state, oldest)


def _published_at(cursor: Any, state: GroupState, offset: int) -> dt.datetime | None:
    """When the message at ``offset`` was published: from its row, else (deleted by
    retention, its link not yet) from the group's unfinished delivery of it."""
    cursor.execute(PUBLISHED_AT_SQL, [state.topic, offset])
    row = cursor.fetchone()
    published = aware_utc(row[0]) if row is not None else None
    if published is not None:
        return published
    cursor.execute(UNFINISHED_OF_OFFSET_SQL, [state.topic, state.group, offset])
    row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    return (_delivery_stamps(cursor, int(row[0])) or (None, None))[1]


def _delivery_stamps(cursor: Any, message_id: int
                     ) -> tuple[int | None, dt.datetime | None] | None:
    """A delivery's offset and its message's publish time, from its payload (None each
    when changed by hand); its enqueue time stands in for an unreadable publish time.
    None when the delivery is gone."""
    cursor.execute(DELIVERY_STAMPS_SQL, [message_id])
    row = cursor.fetchone()
    if row is None:
        return None
    given = [value.decode() if isinstance(value, bytes) else str(value) for value in row[:2]]
    try:
        offset: int | None = int(given[0])
    except ValueError:
        offset = None
    try:
        published: dt.datetime | None = dt.datetime.fromisoformat(given[1])
    except ValueError:
        published = None
    if published is None:
        return offset, aware_utc(row[2])
    return offset, published if published.tzinfo else published.replace(tzinfo=dt.UTC)


def _unsequenced(cursor: Any, topic: str) -> tuple[int, dt.datetime | None]:
    """The topic's messages without an offset, counted up to one past the cap, and when
    the oldest of them was published (None when there are none)."""
    cursor.execute(UNSEQUENCED_COUNT_SQL, [topic, UNSEQUENCED_COUNT_CAP + 1])
    count, lowest = cursor.fetchone()
    if not count:
        return 0, None
    cursor.execute(PUBLISHED_BY_ID_SQL, [lowest])
    row = cursor.fetchone()
    return int(count), aware_utc(row[0]) if row is not None else None


def topic_bounds(topic: str, alias: str | None = None) -> tuple[int, int] | None:
    """The topic's first kept and last offsets; None when it has no row yet (no message
    of it was given an offset)."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        return kept_bounds(cursor, topic)
