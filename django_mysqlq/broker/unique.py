"""Unique jobs: a dedup key kept taken for a period after its message succeeded.

While a message is unfinished its ``dedup_key`` (a unique column of the message table)
is the lock. A message enqueued with ``unique_for=seconds`` also keeps its key after it
succeeded: its ack writes a row of ``mysqlq_unique_key`` (key, message, ``expires_at``)
in the ack's own transaction, and an enqueue with ``unique_for`` refuses the key while
that row's ``expires_at`` lies ahead.

Locks, in the one order everyone takes them (so producers and acks never deadlock):
the message row's dedup key first (the enqueue's INSERT, the ack's DELETE), then the
key's row. The enqueue never reads a missing key row with a locking read (under
REPEATABLE READ that locks the gap beside it, which would hold up the acks of other
keys for as long as the caller's transaction lasts): it makes the row first, already
expired, with an upsert on the primary key, which locks that one row; then it reads it
back with ``FOR UPDATE``, which sees the latest committed row whatever the caller's
snapshot. Retention deletes expired rows, stepping over locked ones.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ..messages import ClaimedMessage, NewMessage
from ..models import unique_key_id
from .base import connection_for, default_alias, in_transaction, naive_utc, placeholders

UNIQUE_TABLE = "mysqlq_unique_key"

#: The key's row for this enqueue: made (already expired: nothing taken) when missing;
#: locked either way (an upsert on the primary key locks the row, not a gap).
TAKE_ROW_SQL = f"""
INSERT INTO {UNIQUE_TABLE} (id, dedup_key, message_id, task_name, queue, succeeded_at,
                            expires_at)
VALUES (%s, %s, 0, %s, %s, NULL, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE id = id
"""
#: The message that keeps the key taken, if its period still runs (latest committed row).
PERIOD_HOLDER_SQL = f"""
SELECT message_id FROM {UNIQUE_TABLE}
 WHERE id = %s AND message_id > 0 AND expires_at > UTC_TIMESTAMP(6)
   FOR UPDATE
"""
#: One row of the ack's upsert: the key stays taken ``unique_for`` seconds from now.
_REMEMBER_ROW = ("(%s, %s, %s, %s, %s, UTC_TIMESTAMP(6), "
                 "UTC_TIMESTAMP(6) + INTERVAL %s SECOND)")
REMEMBER_SQL = f"""
INSERT INTO {UNIQUE_TABLE} (id, dedup_key, message_id, task_name, queue, succeeded_at,
                            expires_at)
VALUES {{rows}}
ON DUPLICATE KEY UPDATE dedup_key = VALUES(dedup_key), message_id = VALUES(message_id),
       task_name = VALUES(task_name), queue = VALUES(queue),
       succeeded_at = VALUES(succeeded_at), expires_at = VALUES(expires_at)
"""
#: Expired rows for retention, stepping over rows an enqueue holds...
EXPIRED_SQL = f"""
SELECT id FROM {UNIQUE_TABLE} FORCE INDEX (mysqlq_uniq_expires)
 WHERE expires_at < %s
 ORDER BY expires_at
 LIMIT %s
   FOR UPDATE SKIP LOCKED
"""
#: ... deleted by id, still expired.
DELETE_EXPIRED_SQL = f"DELETE FROM {UNIQUE_TABLE} WHERE id IN ({{ids}}) AND expires_at < %s"
#: An operator frees keys at once (the admin's action).
FREE_SQL = f"DELETE FROM {UNIQUE_TABLE} WHERE id IN ({{ids}})"


def period_holder(cursor: Any, message: NewMessage) -> int | None:
    """Inside the enqueue's transaction, after its INSERT: the id of the message whose
    success keeps ``message.dedup_key`` taken, or None if no period runs."""
    assert message.dedup_key is not None
    key_id = unique_key_id(message.dedup_key)
    cursor.execute(TAKE_ROW_SQL, [key_id, message.dedup_key, message.task_name[-255:],
                                  message.queue])
    cursor.execute(PERIOD_HOLDER_SQL, [key_id])
    row = cursor.fetchone()
    return None if row is None else int(row[0])


def remember(cursor: Any, messages: Sequence[ClaimedMessage]) -> int:
    """Inside an ack's transaction: keep the keys of these succeeded messages taken for
    their ``unique_for`` seconds (messages without one are left out)."""
    keep = sorted(((unique_key_id(m.dedup_key), m) for m in messages
                   if m.unique_for > 0 and m.dedup_key is not None), key=lambda pair: pair[0])
    if not keep:
        return 0
    params: list[Any] = []
    for key_id, message in keep:
        params += [key_id, message.dedup_key, message.id, message.task_name, message.queue,
                   message.unique_for]
    cursor.execute(REMEMBER_SQL.format(rows=", ".join([_REMEMBER_ROW] * len(keep))), params)
    return len(keep)


def purge_unique_keys_batch(before: dt.datetime, limit: int) -> int:
    """Delete up to ``limit`` keys whose period ended before ``before``; return how many."""
    alias = default_alias()
    cutoff = naive_utc(before)

    def body(cursor: Any) -> int:
        cursor.execute(EXPIRED_SQL, [cutoff, limit])
        ids = [str(row[0]) for row in cursor.fetchall()]
        if not ids:
            return 0
        cursor.execute(DELETE_EXPIRED_SQL.format(ids=placeholders(len(ids))), [*ids, cutoff])
        return int(cursor.rowcount)

    return in_transaction(alias, body)


def free_unique_keys(key_ids: Sequence[str]) -> int:
    """Free keys before their period ends (an operator's action); return how many."""
    ids = sorted(set(key_ids))
    if not ids:
        return 0
    with connection_for(default_alias()).cursor() as cursor:
        cursor.execute(FREE_SQL.format(ids=placeholders(len(ids))), ids)
        return int(cursor.rowcount)
