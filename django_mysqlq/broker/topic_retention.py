"""Topic retention: delete a topic's oldest messages in short batches by primary key.

A batch reads the next kept offsets along the (topic, offset) index, takes the prefix
published before the cut-off (and, when asked, at or before every group's position),
deletes those rows by id and moves ``mysqlq_topic.first_offset`` past them in one short
transaction; their delivery links go in batches of their own. Publishers only insert new
rows and the sequencer stamps rows without an offset, so neither waits on a batch; the
topic row's lock is held for one UPDATE. Rows are deleted as a prefix of the offsets, so
what is kept is always ``first_offset … last_offset``. A ``first_offset`` that can't
be true (changed by hand) is read as the lowest kept offset and written back so by the
next batch (see kept.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import OperationalError

from .base import connection_for, default_alias, in_transaction, is_lock_wait, logger, naive_utc
from .kept import kept_bounds
from .lockwait import bounded_lock_waits
from .topic_ops import DELIVERY_TABLE, GROUP_TABLE
from .topics import OFFSET_INDEX, TOPIC_MESSAGE_TABLE, TOPIC_TABLE

TOPIC_NAMES_SQL = f"SELECT name FROM {TOPIC_TABLE} ORDER BY name"
#: The lowest position among the topic's groups (NULL: no group).
SLOWEST_GROUP_SQL = f"SELECT MIN(position) FROM {GROUP_TABLE} WHERE topic = %s"
OLDEST_SQL = (f"SELECT id, msg_offset, published_at FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
              f"({OFFSET_INDEX}) WHERE topic = %s AND msg_offset >= %s "
              "ORDER BY msg_offset LIMIT %s")
#: One row by primary key per statement: a list (``id IN …``, even with the index
#: forced) reads past its last id and waits on the row lock of an open publisher's
#: newer insert (measured: the open-publisher test).
DELETE_SQL = f"DELETE FROM {TOPIC_MESSAGE_TABLE} WHERE id = %s"
MOVE_FIRST_SQL = (f"UPDATE {TOPIC_TABLE} SET first_offset = GREATEST(first_offset, %s) "
                  "WHERE name = %s")
DELETE_LINKS_SQL = (f"DELETE FROM {DELIVERY_TABLE} WHERE topic = %s AND msg_offset < %s "
                    "ORDER BY topic, msg_offset LIMIT %s")


class _GroupMovedBack(Exception):
    """A group's position fell below a retention batch while it deleted: roll it back."""


class GroupMovedBack(Exception):
    """A group of the topic was moved back (a reset, a new group at the earliest) into
    an archived range after its batch was planned: the range's delete was rolled back,
    its messages are kept for the group (the batch stays archived, not deleted)."""

    def __init__(self, topic: str, position: int, last: int) -> None:
        super().__init__(
            f"a group of topic {topic!r} is at offset {position}, below archived offset "
            f"{last} (reset back, or a new group starting at the earliest, after the batch "
            "was planned): its messages were kept, not deleted. The batch stays committed; "
            "run archive again once every group has passed its offsets.")
        self.topic, self.position, self.last = topic, position, last


def _slowest_below(cursor: Any, topic: str, last: int) -> int | None:
    """The slowest group's position if it is below ``last`` (its offsets still needed),
    else None. Read holding the topic row (after ``MOVE_FIRST_SQL``), in READ COMMITTED:
    a reset still open waits for this commit, then sees ``first_offset`` moved."""
    cursor.execute(SLOWEST_GROUP_SQL, [topic])
    slowest = cursor.fetchone()[0]
    return int(slowest) if slowest is not None and int(slowest) < last else None


#: What a retention batch writes: a stranger's table lock on any holds every topic.
RETENTION_TABLES = (TOPIC_TABLE, TOPIC_MESSAGE_TABLE, DELIVERY_TABLE)
#: Writes nothing, but needs the table's write metadata lock (what LOCK TABLES … READ or
#: WRITE, and an ALTER's exclusive phase, refuse).
PROBE_WRITE_SQL = "DELETE FROM {table} WHERE FALSE"


def tables_held(alias: str | None = None) -> bool:
    """Whether a stranger holds a table lock on one of :data:`RETENTION_TABLES` (LOCK
    TABLES, an ALTER): after a lock wait, it tells a table held (every topic would wait
    the same: give the step up) from one topic's row held (go on with the others). Asked
    without waiting (MySQL: its shortest wait, a second)."""
    alias = alias or default_alias()
    with bounded_lock_waits(0, alias), connection_for(alias).cursor() as cursor:
        for table in RETENTION_TABLES:
            try:
                cursor.execute(PROBE_WRITE_SQL.format(table=table))
            except OperationalError as exc:
                if is_lock_wait(exc):
                    return True
                raise
    return False


def topic_names(alias: str | None = None) -> list[str]:
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(TOPIC_NAMES_SQL)
        return [str(row[0]) for row in cursor.fetchall()]


def prune_topic_batch(topic: str, before: dt.datetime, limit: int, *,
                      wait_for_groups: bool = True, alias: str | None = None) -> int:
    """Delete at most ``limit`` of ``topic``'s oldest messages published before
    ``before`` (and passed by every group with ``wait_for_groups``); return how many."""
    alias = alias or default_alias()
    with connection_for(alias).cursor() as cursor:
        bounds = kept_bounds(cursor, topic, repair=True)
        if bounds is None:
            return 0
        first = bounds[0]
        ceiling: int | None = None
        if wait_for_groups:
            cursor.execute(SLOWEST_GROUP_SQL, [topic])
            slowest = cursor.fetchone()[0]
            ceiling = None if slowest is None else int(slowest)
        cursor.execute(OLDEST_SQL, [topic, first, int(limit)])
        rows = cursor.fetchall()
    cut = naive_utc(before)
    ids: list[int] = []
    last = 0
    for message_id, offset, published_at in rows:
        # (A zero date, changed by hand, reads as None: older than any cut-off, as the
        # server compares it; the archive's SQL takes it the same way.)
        stamp = (dt.datetime.min if published_at is None
                 else published_at.replace(tzinfo=None))
        if stamp >= cut or (ceiling is not None and int(offset) > ceiling):
            break
        ids.append(int(message_id))
        last = int(offset)
    if not ids:
        return 0

    def body(cursor: Any) -> int:
        deleted = 0
        for message_id in ids:
            cursor.execute(DELETE_SQL, [message_id])
            deleted += int(cursor.rowcount)
        cursor.execute(MOVE_FIRST_SQL, [last + 1, topic])
        # The positions were read before this transaction: a reset (or a new group
        # starting at the earliest) may have moved one back since: read them again.
        if wait_for_groups and _slowest_below(cursor, topic, last) is not None:
            raise _GroupMovedBack
        return deleted

    try:
        deleted = in_transaction(alias, body)
    except _GroupMovedBack:
        logger.info("Retention of topic %r: a group moved back below offset %d while a "
                    "batch was deleting; the batch was rolled back and is tried again at "
                    "the next upkeep.", topic, last)
        return 0
    _delete_links(topic, last + 1, limit, alias)
    return deleted


def _delete_links(topic: str, below: int, limit: int, alias: str) -> None:
    """Delete the delivery links of ``topic``'s offsets below ``below``, in batches."""
    while True:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(DELETE_LINKS_SQL, [topic, below, int(limit)])
            if cursor.rowcount < limit:
                break


# The archive (``queuepipeline archive --source topics``) takes exactly what retention
# would delete with ``wait_for_groups``: a prefix of the kept offsets, each published
# before the cut-off and at or below every group's position, and deletes it the same way.

#: The first offset in a range published at or after the cut-off: the prefix ends before.
FIRST_TOO_NEW_SQL = (f"SELECT MIN(msg_offset) FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
                     f"({OFFSET_INDEX}) WHERE topic = %s AND msg_offset >= %s "
                     "AND msg_offset <= %s AND published_at >= %s")
#: Rows of an offset range (along the index, which holds the primary key: no row read).
RANGE_COUNT_SQL = (f"SELECT COUNT(*) FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
                   "WHERE topic = %s AND msg_offset >= %s AND msg_offset < %s")
#: What the source holds of one archive batch (an offset range of one topic), per day:
#: rows, and sum, first and last of their ids.
TOPIC_STATS_SQL = (f"SELECT DATE(published_at) AS day, COUNT(*), SUM(id), MIN(id), MAX(id) "
                   f"FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
                   "WHERE topic = %s AND msg_offset >= %s AND msg_offset < %s GROUP BY day")
CHUNK_LAST_OFFSET_SQL = (f"SELECT MAX(msg_offset) FROM {TOPIC_MESSAGE_TABLE} "
                         "WHERE topic = %s AND id IN ({ids})")


def archivable_offsets(topic: str, before: dt.datetime, alias: str | None = None, *,
                       repair: bool = True) -> tuple[int, int, int] | None:
    """``(first offset, last offset, rows)`` of the prefix of ``topic``'s kept messages
    retention would delete now (published before ``before``, passed by every group), or
    None when there is none. ``repair=False`` (a dry run, which changes nothing) leaves a
    ``first_offset`` that can't be true as it is (read as the lowest kept offset)."""
    alias = alias or default_alias()
    with connection_for(alias).cursor() as cursor:
        bounds = kept_bounds(cursor, topic, repair=repair)
        if bounds is None:
            return None
        first, last = bounds
        cursor.execute(SLOWEST_GROUP_SQL, [topic])
        slowest = cursor.fetchone()[0]
        if slowest is not None:
            last = min(last, int(slowest))
        if last < first:
            return None
        cursor.execute(FIRST_TOO_NEW_SQL, [topic, first, last, naive_utc(before)])
        too_new = cursor.fetchone()[0]
        if too_new is not None:
            last = int(too_new) - 1
        if last < first:
            return None
        cursor.execute(RANGE_COUNT_SQL, [topic, first, last + 1])
        rows = int(cursor.fetchone()[0])
    return None if rows == 0 else (first, last, rows)


#: ``{(day "YYYY-MM-DD", topic): (rows, sum of ids, first id, last id)}``
TopicStats = dict[tuple[str, str], tuple[int, int, int, int]]


def topic_partition_stats(topic: str, low: int, high: int,
                          alias: str | None = None) -> TopicStats:
    """Per ``(day, topic)``: rows, sum, first and last id of ``topic``'s messages with
    ``low <= offset < high`` (what an archive batch over that range must have written)."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(TOPIC_STATS_SQL, [topic, low, high])
        rows = cursor.fetchall()
    return {(day.isoformat(), topic): (int(count), int(total), int(first), int(last))
            for day, count, total, first, last in rows}


def delete_archived(topic: str, ids: list[int], alias: str | None = None,
                    links_batch: int = 1000) -> int:
    """Delete these archived messages of ``topic`` (a prefix of its kept offsets, in
    offset order) as retention does: by primary key, moving ``first_offset`` past them
    in the same short transaction, then their delivery links. Return how many went
    (a message already gone, deleted by an earlier run or by retention, counts 0).

    A group moved back into these offsets since the batch was planned (retention's race)
    rolls the delete back and raises :class:`GroupMovedBack`: the archive must not mark
    the batch done, and its messages stay for the group."""
    if not ids:
        return 0
    alias = alias or default_alias()

    def body(cursor: Any) -> tuple[int, int | None]:
        cursor.execute(CHUNK_LAST_OFFSET_SQL.format(ids=", ".join(["%s"] * len(ids))),
                       [topic, *ids])
        last = cursor.fetchone()[0]
        deleted = 0
        for message_id in ids:
            cursor.execute(DELETE_SQL, [message_id])
            deleted += int(cursor.rowcount)
        if last is None:
            return deleted, None
        cursor.execute(MOVE_FIRST_SQL, [int(last) + 1, topic])
        if (position := _slowest_below(cursor, topic, int(last))) is not None:
            raise GroupMovedBack(topic, position, int(last))
        return deleted, int(last)

    try:
        deleted, last = in_transaction(alias, body)
    except GroupMovedBack as exc:
        logger.warning("Archive of topic %r: %s", topic, exc)
        raise
    if last is not None:
        _delete_links(topic, last + 1, links_batch, alias)
    return deleted
