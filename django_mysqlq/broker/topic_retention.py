"""Topic retention: delete a topic's oldest messages in short batches by primary key.

A batch reads the next kept offsets along the (topic, offset) index, takes the prefix
published before the cut-off (and, when asked, at or before every group's position),
deletes those rows by id and moves ``mysqlq_topic.first_offset`` past them in one short
transaction; their delivery links go in batches of their own. Publishers only insert new
rows and the sequencer stamps rows without an offset, so neither waits on a batch; the
topic row's lock is held for one UPDATE. Rows are deleted as a prefix of the offsets, so
what is kept is always ``first_offset … last_offset``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .base import connection_for, default_alias, in_transaction, naive_utc
from .topic_ops import DELIVERY_TABLE, GROUP_TABLE
from .topics import OFFSET_INDEX, TOPIC_MESSAGE_TABLE, TOPIC_TABLE

TOPIC_NAMES_SQL = f"SELECT name FROM {TOPIC_TABLE} ORDER BY name"
FIRST_OFFSET_SQL = f"SELECT first_offset FROM {TOPIC_TABLE} WHERE name = %s"
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
        cursor.execute(FIRST_OFFSET_SQL, [topic])
        row = cursor.fetchone()
        if row is None:
            return 0
        first = int(row[0])
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
        stamp = published_at.replace(tzinfo=None) if published_at.tzinfo else published_at
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
        return deleted

    deleted = in_transaction(alias, body)
    while True:  # the links of what was deleted, in batches of their own
        with connection_for(alias).cursor() as cursor:
            cursor.execute(DELETE_LINKS_SQL, [topic, last + 1, int(limit)])
            if cursor.rowcount < limit:
                break
    return deleted
