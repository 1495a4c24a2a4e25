"""Topics: publish (in the caller's transaction) and the sequencer that gives offsets.

An AUTO_INCREMENT id is taken at insert and seen at commit: a publisher whose transaction
stays open holds id 5 while id 6 commits. A reader that moved "past 6" would never see 5.
So publishers only insert, with a NULL offset, and offsets are given afterwards, to
committed rows only: the sequencer locks the topic's row (``mysqlq_topic``), picks the
rows without an offset in id order with a plain (consistent, non-locking) read, which
sees exactly the transactions committed when it began, never waits for an open one and
never sees part of one, and stamps them ``last_offset + 1 …`` in the same transaction.
An uncommitted row is sequenced by a later round. Sequencing rounds follow one another
on the row lock, so the offsets a reader can see are always a gap-free prefix 1 … N:
reading "after offset N" can never skip a row.

Not ``FOR UPDATE SKIP LOCKED``: that reads row by row, so a publisher committing while
the scan runs has its first rows skipped (still locked) and its later ones taken (found
committed): one producer's messages would get offsets out of order (measured: the
concurrent-publisher test caught it about one run in three).

The worker's members call :func:`try_sequence` instead: one autocommit look for a committed
row without an offset first (most rounds of a busy member find none), and the topic's row
taken ``SKIP LOCKED``: while one member stamps, the others go on pumping what is already
sequenced rather than queueing on the row (that wait was the four-group bench's). Only the
row lock is skipped, never a message row: the stamping round is the same.

Publishers never touch the topic's row (a shared lock there would make the sequencer wait
for every open business transaction); the sequencer creates it.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from django.db import DatabaseError, IntegrityError, transaction

from ..conf import get_settings
from ..signals import topic_published
from .base import (
    NOW_SQL,
    all_or_none,
    aware_utc,
    connection_for,
    connection_lost,
    default_alias,
    error_code,
    in_transaction,
    is_lock_wait,
    logger,
    send_robust,
)
from .group_ahead import ANY_PAST_END, set_back_past_end
from .packets import escaped_size, refuse_past_packet, split_by_size, statement_room
from .park import wake
from .topic_repairs import DUPLICATE_KEY, counter_behind, log_sequenced_again, sequenced_before

# (Re-exported: the modules that use them took them from here first.)
from .topictables import OFFSET_INDEX as OFFSET_INDEX
from .topictables import TOPIC_MESSAGE_TABLE as TOPIC_MESSAGE_TABLE
from .topictables import TOPIC_TABLE as TOPIC_TABLE

#: Rows per multi-row INSERT of publish_many (bytes per statement: see packets.py).
PUBLISH_CHUNK = 1000
#: Bytes of a row besides its payload and key.
PUBLISH_ROW_BYTES = 120
#: Bytes a group's delivery row takes in the pump's INSERT besides the message's payload,
#: at most: the enqueue row's own (400), its queue, task and subject names (4 bytes a
#: character, 448 characters), and the payload's wrapper with the offset, the key (JSON
#: escapes, up to 12 bytes a character) and the time.
DELIVERY_ROW_BYTES = 8192
#: Rows one sequencing transaction stamps.
SEQUENCE_BATCH = 1000

_PUBLISH_ROW = "(%s, %s, %s, UTC_TIMESTAMP(6))"
#: A row of a call that takes several statements: the publish time read once
#: (``NOW_SQL``), so all its rows share one, as one statement's rows do.
_PUBLISH_ROW_AT = "(%s, %s, %s, %s)"
#: Publish: one or more ``{rows}``. The offset stays NULL until the sequencer stamps it.
PUBLISH_SQL = (f"INSERT INTO {TOPIC_MESSAGE_TABLE} (topic, msg_key, payload, published_at) "
               "VALUES {rows}")

#: The topic's row, made by the first sequencing round.
CREATE_TOPIC_SQL = (f"INSERT IGNORE INTO {TOPIC_TABLE} (name, last_offset, first_offset, "
                    "created_at) VALUES (%s, 0, 1, UTC_TIMESTAMP(6))")
#: The sequencer's lock: one round per topic at a time, in order; and whether a group of
#: the topic is past its last offset (``group_ahead``: set back before offsets are given).
LOCK_TOPIC_SQL = (f"SELECT last_offset, {ANY_PAST_END} FROM {TOPIC_TABLE} t WHERE name = %s"
                  " FOR UPDATE")
#: The worker's round: the same lock, skipped while another caller holds it.
LOCK_TOPIC_SKIP_SQL = f"{LOCK_TOPIC_SQL} SKIP LOCKED"
#: Whether any committed row of the topic lacks an offset (autocommit: no lock, no wait).
ANY_UNSEQUENCED_SQL = (
    f"SELECT 1 FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
    "WHERE topic = %s AND msg_offset IS NULL LIMIT 1"
)
#: The same, among the rows inserted up to an id (a start's: ``NEWEST_MESSAGE_SQL``).
ANY_UNSEQUENCED_UP_TO_SQL = f"{ANY_UNSEQUENCED_SQL[:-8]} AND id <= %s LIMIT 1"
#: The newest topic message's id, of any topic (the primary key's end: one dive).
NEWEST_MESSAGE_SQL = f"SELECT COALESCE(MAX(id), 0) FROM {TOPIC_MESSAGE_TABLE}"
#: Whether the topic has its row (a plain read: never waits for the sequencer's lock).
TOPIC_EXISTS_SQL = f"SELECT 1 FROM {TOPIC_TABLE} WHERE name = %s"
#: Committed rows without an offset, in insert order: a consistent read (one snapshot,
#: whole transactions) that neither waits for nor sees rows of open transactions.
UNSEQUENCED_SQL = (
    f"SELECT id FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
    "WHERE topic = %s AND msg_offset IS NULL ORDER BY id LIMIT %s"
)
#: The same rows in the offset index's own order, without a sort. InnoDB orders a
#: secondary index's entries by all its fields and then the primary key, so a topic's
#: NULL offsets come in id order; MariaDB's optimizer doesn't count on that for a UNIQUE
#: index (its extended keys leave them out) and sorted the whole backlog in every round:
#: 70 ms a round with 500,000 rows unsequenced (all readers down for a while), 0.5 ms so.
#: With each row's ``sequenced_at``, set on a row without an offset only where one was
#: cleared by hand (see :func:`.topic_repairs.log_sequenced_again`): not in the index, so
#: a lookup per row read (``batch`` at most, the rows the stamp then updates). Measured
#: on rounds of 1,000: 0.5-1.1 ms more on a read of 0.7-1.2 ms, in a round whose stamp
#: takes some 30 ms; a separate check of the ids by primary key took 1.7-5 ms and a round trip.
UNSEQUENCED_IN_INDEX_ORDER_SQL = (
    f"SELECT id, sequenced_at FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
    "WHERE topic = %s AND msg_offset IS NULL LIMIT %s"
)
#: Stamp the picked rows: ``{cases}`` is ``WHEN id THEN offset`` per row.
STAMP_SQL = (f"UPDATE {TOPIC_MESSAGE_TABLE} SET msg_offset = CASE id {{cases}} END, "
             "sequenced_at = UTC_TIMESTAMP(6) WHERE id IN ({ids})")
ADVANCE_TOPIC_SQL = (f"UPDATE {TOPIC_TABLE} SET last_offset = %s, "
                     "sequenced_at = UTC_TIMESTAMP(6) WHERE name = %s")
#: The highest offset given out (0: none yet, or no such topic).
LAST_OFFSET_SQL = f"SELECT last_offset FROM {TOPIC_TABLE} WHERE name = %s"
#: The queues of a topic's groups, as their rows say. A publisher that never imported the
#: handlers' module (a web process whose views only publish) knows none of them from its
#: subscriptions, and its publishes woke nobody: members found them at the end of a park.
GROUP_QUEUES_SQL = "SELECT queue FROM mysqlq_topic_group WHERE topic = %s"
#: Seconds a publisher trusts the groups it read of a topic (a group created meanwhile
#: is woken from the next read on; until then its members poll, as they always do).
GROUP_QUEUES_SECONDS = 5.0
_group_queues: dict[tuple[str, str], tuple[float, tuple[str, ...]]] = {}


def publish(topic: str, rows: Sequence[tuple[str | None, str]],
            wake_queues: Sequence[str] = ()) -> int:
    """Insert ``(key, payload JSON)`` rows in the caller's transaction (if any; else in one
    of their own when they take several statements); return the id of the first row.
    After commit, wake the workers of ``wake_queues`` (the groups this process knows
    subscribe to the topic) and send ``topic_published``."""
    if not rows:
        return 0
    # Topics live on MYSQLQ["DATABASE"] only (their pumps and broadcast readers read
    # there), whatever this thread is bound to: a task running for a queue of another
    # database published into that database's tables, where nothing delivers them.
    alias = get_settings().DATABASE
    sizes = [escaped_size(payload) + 4 * len(key or "") + PUBLISH_ROW_BYTES
             for key, payload in rows]
    _check_packet(topic, [escaped_size(payload) for _, payload in rows], alias)
    chunks = split_by_size(list(rows), sizes, statement_room(alias), PUBLISH_CHUNK)

    def insert() -> int:
        first = 0
        with connection_for(alias).cursor() as cursor:
            at: tuple[Any, ...] = ()
            if len(chunks) > 1:  # (one statement's UTC_TIMESTAMP(6) is one time already)
                cursor.execute(NOW_SQL)
                at = (cursor.fetchone()[0],)
            row = _PUBLISH_ROW_AT if at else _PUBLISH_ROW
            for chunk in chunks:
                params: list[Any] = []
                for key, payload in chunk:
                    params.extend((topic, key, payload, *at))
                cursor.execute(PUBLISH_SQL.format(rows=", ".join([row] * len(chunk))), params)
                first = first or int(cursor.lastrowid)
        return first

    first = all_or_none(alias, len(chunks), insert)  # (several INSERTs: all, or none)
    count = len(rows)
    transaction.on_commit(lambda: _after_publish(topic, count, wake_queues, alias),
                          using=alias)
    return first


def _check_packet(topic: str, sizes: Sequence[int], alias: str) -> None:
    """Refuse a payload whose delivery would not fit in one statement under the server's
    ``max_allowed_packet`` (only a site that raised ``MAX_PAYLOAD_BYTES`` near it can
    publish one): every group's pump would fail on it again and again, and its worker
    with it."""
    refuse_past_packet(sizes, alias, lambda _: f"The payload of a message to topic {topic!r} takes",
                       room_for="a payload with its delivery to a group", send="publish",
                       reserved=DELIVERY_ROW_BYTES)


def _after_publish(topic: str, count: int, queues: Sequence[str], alias: str) -> None:
    if get_settings().WAKEUP:
        try:
            wake(group_queues(topic, alias, queues), alias)
        except DatabaseError as exc:  # committed; workers find them at their next round
            logger.warning("Could not wake idle workers after a publish (%s).", exc)
    send_robust(topic_published, topic, count=count)


def group_queues(topic: str, alias: str, known: Sequence[str] = ()) -> list[str]:
    """The queues of ``topic``'s groups: ``known`` (this process's subscriptions) and
    those the group rows name, read at most once per :data:`GROUP_QUEUES_SECONDS`."""
    now = time.monotonic()
    cached = _group_queues.get((alias, topic))
    if cached is None or now - cached[0] > GROUP_QUEUES_SECONDS:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(GROUP_QUEUES_SQL, [topic])
            cached = (now, tuple(str(row[0]) for row in cursor.fetchall()))
        _group_queues[alias, topic] = cached
    return sorted({*known, *cached[1]})


def sequence(topic: str, batch: int = SEQUENCE_BATCH, alias: str | None = None,
             up_to_id: int | None = None) -> int:
    """Give offsets to committed rows of ``topic`` that have none; return how many.

    Runs in its own transactions (autocommit callers only), one per ``batch`` rows. With
    ``up_to_id``, it ends once every row up to that id has one (rows come in id order):
    a start waits for the messages before it, not for a publisher outpacing it.
    """
    alias = alias or default_alias()
    total = 0
    while True:
        stamped = in_transaction(alias, lambda cursor: sequence_round(cursor, topic, batch))
        assert stamped is not None  # (a waiting round always gets the row)
        total += stamped
        if stamped < batch or (up_to_id is not None
                               and not has_unsequenced(topic, alias, up_to_id)):
            return total


def newest_message_id(alias: str | None = None) -> int:
    """The newest topic message's id (0: none): what a start waits to see stamped."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(NEWEST_MESSAGE_SQL)
        return int(cursor.fetchone()[0])


def ensure_topic(topic: str, alias: str | None = None) -> None:
    """Give the topic its row unless it has one, never waiting for a lock on it: a plain
    read first (``INSERT IGNORE`` of an existing row would wait for a stranger holding
    it). A worker's start needs the row: its members' looks join it, and publishers never
    make it."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(TOPIC_EXISTS_SQL, [topic])
        if cursor.fetchone() is None:
            cursor.execute(CREATE_TOPIC_SQL, [topic])


def topic_exists(topic: str, alias: str | None = None) -> bool:
    """Whether the topic has its row (a plain read: never waits for a lock on it)."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(TOPIC_EXISTS_SQL, [topic])
        return cursor.fetchone() is not None


def has_unsequenced(topic: str, alias: str | None = None, up_to_id: int | None = None
                    ) -> bool:
    """Whether committed messages of ``topic`` (up to the id ``up_to_id``) lack an offset
    (a plain read, no lock)."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        if up_to_id is None:
            cursor.execute(ANY_UNSEQUENCED_SQL, [topic])
        else:
            cursor.execute(ANY_UNSEQUENCED_UP_TO_SQL, [topic, up_to_id])
        return cursor.fetchone() is not None


def try_sequence(topic: str, batch: int = SEQUENCE_BATCH, alias: str | None = None
                 ) -> int | None:
    """:func:`sequence` for the worker's members: 0 at once when no committed row lacks an
    offset, and None when another caller holds the topic's row (its round stamps them; look
    again shortly) instead of waiting for it. Otherwise how many were stamped."""
    alias = alias or default_alias()
    if not has_unsequenced(topic, alias):
        return 0
    total = 0
    while True:
        stamped = in_transaction(
            alias, lambda cursor: sequence_round(cursor, topic, batch, skip_locked=True))
        if stamped is None:
            with connection_for(alias).cursor() as cursor:
                cursor.execute(TOPIC_EXISTS_SQL, [topic])
                if cursor.fetchone() is None:  # no row yet: the waiting round makes it
                    return total + sequence(topic, batch, alias)
            return total or None
        total += stamped
        if stamped < batch:
            return total


class Unsequenced(NamedTuple):
    """A round's pick: the ids to stamp, ascending, and those of them that were sequenced
    before, with their ``sequenced_at`` (an offset cleared by hand)."""

    ids: list[int]
    sequenced_before: list[tuple[int, dt.datetime]]


def unsequenced_ids(cursor: Any, topic: str, batch: int) -> Unsequenced:
    """The lowest ``batch`` ids of the topic's committed rows without an offset, ascending:
    read in the index's order, and only if that read did not come back ascending (a
    server that orders the index otherwise) read again with the sort (ids alone: the
    sort's rows stay the index's, then one look by primary key at those picked)."""
    cursor.execute(UNSEQUENCED_IN_INDEX_ORDER_SQL, [topic, batch])
    rows = cursor.fetchall()
    ids = [int(found[0]) for found in rows]
    if all(low < high for low, high in itertools.pairwise(ids)):
        return Unsequenced(ids, [(int(found[0]), aware_utc(found[1]) or found[1])
                                 for found in rows if found[1] is not None])
    cursor.execute(UNSEQUENCED_SQL, [topic, batch])
    ids = [int(found[0]) for found in cursor.fetchall()]
    return Unsequenced(ids, sequenced_before(cursor, ids) if ids else [])


def sequence_round(cursor: Any, topic: str, batch: int, skip_locked: bool = False
                   ) -> int | None:
    """One sequencing round in the caller's open transaction: how many were stamped, or
    None when ``skip_locked`` found the topic's row held (or missing), or the row of one
    of its groups past its last offset (``group_ahead``)."""
    cursor.execute(LOCK_TOPIC_SKIP_SQL if skip_locked else LOCK_TOPIC_SQL, [topic])
    row = cursor.fetchone()
    if row is None and skip_locked:
        return None  # held by another round (or no row yet: the caller looks)
    if row is None:
        cursor.execute(CREATE_TOPIC_SQL, [topic])
        cursor.execute(LOCK_TOPIC_SQL, [topic])
        row = cursor.fetchone()
    last = int(row[0])
    if row[1]:  # (a group past the end: none of the offsets after it may be skipped)
        end = set_back_past_end(cursor, topic, last, skip_locked)
        if end is None:
            return None
        last = end
    ids, again = unsequenced_ids(cursor, topic, batch)
    if not ids:
        return 0
    try:
        _stamp(cursor, ids, last)
    except IntegrityError as exc:
        if error_code(exc) != DUPLICATE_KEY:
            raise
        last = counter_behind(cursor, topic, last)
        _stamp(cursor, ids, last)
    cursor.execute(ADVANCE_TOPIC_SQL, [last + len(ids), topic])
    if again:
        log_sequenced_again(topic, again, {message_id: last + index for index, message_id
                                            in enumerate(ids, start=1)})
    return len(ids)


def _stamp(cursor: Any, ids: Sequence[int], last: int) -> None:
    """Give ``ids`` the offsets ``last + 1 …`` (one statement: all or none)."""
    cases = " ".join("WHEN %s THEN %s" for _ in ids)
    params: list[Any] = []
    for index, message_id in enumerate(ids, start=1):
        params.extend((message_id, last + index))
    cursor.execute(STAMP_SQL.format(cases=cases, ids=", ".join(["%s"] * len(ids))),
                   [*params, *ids])


#: The next topic name that has messages: one dive into the (topic, offset) index per
#: topic, whatever the server's statistics say (a GROUP BY's loose scan is a choice of
#: the optimizer, which walked the whole index of a small, fresh table instead).
NEXT_TOPIC_SQL = (
    f"SELECT topic FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
    "WHERE topic > %s ORDER BY topic LIMIT 1"
)
#: Topics looked at per call, in name order from where the last call stopped (wrapping
#: around): each topic is looked at within a few calls, however many there are. (Each
#: call started over at the first name: a topic past the 1,000th was never sequenced by
#: the leader, and retention, which goes by offset, never deleted its messages.)
UNREAD_TOPICS_PER_CALL = 1000
_unread_after: dict[str, str] = {}


def _topics_with_unsequenced(alias: str) -> list[str]:
    """Topics with committed rows that have no offset: two index dives per topic."""
    found: list[str] = []
    start = after = _unread_after.get(alias, "")
    wrapped = False
    with connection_for(alias).cursor() as cursor:
        for _ in range(UNREAD_TOPICS_PER_CALL):
            cursor.execute(NEXT_TOPIC_SQL, [after])
            row = cursor.fetchone()
            if row is None:
                if wrapped or not start:
                    after = ""
                    break
                after, wrapped = "", True  # past the last name: on from the first
                continue
            if wrapped and str(row[0]) >= start:
                break  # round the whole list
            after = str(row[0])
            cursor.execute(ANY_UNSEQUENCED_SQL, [after])
            if cursor.fetchone() is not None:
                found.append(after)
    _unread_after[alias] = after
    return found


def _round_of(cursor: Any, *, topic: str, skip_locked: bool) -> int | None:
    return sequence_round(cursor, topic, SEQUENCE_BATCH, skip_locked=skip_locked)


def sequence_unread(rounds: int, alias: str | None = None,
                    budget_seconds: float | None = None,
                    on_error: Callable[[str, DatabaseError], None] | None = None
                    ) -> dict[str, int]:
    """Give offsets to any topic's committed rows that have none: rounds of
    ``SEQUENCE_BATCH`` taken in turn across the topics, at most ``rounds`` per topic, and
    after each topic's first round only while ``budget_seconds`` last; return how many
    were stamped per topic.

    The recovery leader's duty: only a worker that reads a topic (a member of one of its
    groups, a broadcast subscriber) sequences it, so the messages of a topic nobody reads
    at the moment would have no offset and no topic row: retention, lookup and the
    topic statistics, which all go by offset, would never see them. A topic whose reader
    is stamping it right now (its row held) is left to that reader. Taking the topics in
    turn keeps one topic's backlog from using the whole budget.

    With ``on_error``, a topic whose round fails on its own (a row changed by hand, a
    value out of range) is handed to it and left for this call, and the other topics go
    on: one broken topic must not keep the rest without offsets. A lock wait, or a
    failure that left no connection, is raised as without it (nothing else could go on).
    """
    alias = alias or default_alias()
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    done: dict[str, int] = {}
    pending = _topics_with_unsequenced(alias)
    for turn in range(rounds):
        more: list[str] = []
        for topic in pending:
            if turn and deadline is not None and time.monotonic() >= deadline:
                break
            try:
                stamped = _unread_round(alias, topic)
            except DatabaseError as exc:
                if on_error is None or is_lock_wait(exc) or connection_lost(alias):
                    raise
                on_error(topic, exc)
                continue
            if stamped is None:
                continue  # a reader holds the row: its round stamps them
            if stamped:
                done[topic] = done.get(topic, 0) + stamped
            if stamped == SEQUENCE_BATCH:
                more.append(topic)
        pending = more
        if not pending:
            break
    return done


def _unread_round(alias: str, topic: str) -> int | None:
    """One round for :func:`sequence_unread`: how many were stamped, or None when a reader
    holds the topic's row."""
    stamped = in_transaction(alias, functools.partial(_round_of, topic=topic,
                                                      skip_locked=True))
    if stamped is not None:
        return stamped
    with connection_for(alias).cursor() as cursor:
        cursor.execute(TOPIC_EXISTS_SQL, [topic])
        if cursor.fetchone() is not None:
            return None
    # No row yet: a waiting round makes it (and stamps).
    return in_transaction(alias, functools.partial(_round_of, topic=topic, skip_locked=False))


def last_offset(topic: str, alias: str | None = None) -> int:
    """The highest offset given out in ``topic`` (0 when none)."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(LAST_OFFSET_SQL, [topic])
        row = cursor.fetchone()
    return int(row[0]) if row is not None else 0
