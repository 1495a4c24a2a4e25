"""Unique jobs: a dedup key kept taken for a period after its message succeeded.

While a message is unfinished its ``dedup_key`` (a unique column of the message table)
is the lock. A message enqueued with ``unique_for=seconds`` also keeps its key after it
succeeded: its ack writes a row of ``mysqlq_unique_key`` (key, message, ``expires_at``)
in the ack's own transaction, and an enqueue with ``unique_for`` refuses the key while
that row's ``expires_at`` lies ahead.

Locks, in the one order everyone takes them (so producers and acks never deadlock):
the key's row first, then the message rows' dedup key. An enqueue with ``unique_for``
locks the key's row before its rate keys, gates and INSERT and holds it until its
transaction ends: producers of one key check the period and insert one at a time, and
one that finds a period inserts nothing. They must not insert side by side: InnoDB's
duplicate check on the ``dedup_key`` index takes a shared next-key lock on each entry of
the key it meets (an acked message's entry stays, delete-marked, until purge) and on the
entry after them, and producers waiting on an insert that is rolled back inherit such
locks on the gap it leaves; two producers holding them each wait for the other's insert,
a deadlock. The ack locks its messages' key rows (making missing ones, already expired)
before its gates and its DELETE, stepping over rows another transaction holds (their
messages are acked a moment later, as for a busy gate), and writes the periods after the
DELETE, on the rows it holds. It learns which claims it still owns before it deletes (a
locking read), so a lost claim never rolls back key rows it made while producers may be
waiting on them.

One case is left to InnoDB, as for any new row: a transaction that made the key's row
(the first enqueue of a key, or the first since retention deleted its row) and then
rolls back while two or more producers of the key wait on that row; they inherit a gap
lock from it and one of them gets a deadlock.

The enqueue never reads a missing key row with a locking read (under REPEATABLE READ
that locks the gap beside it, which would hold up the acks of other keys for as long as
the caller's transaction lasts): it makes the row first, already expired, with an upsert
on the primary key, which locks that one row; then it reads it back with ``FOR UPDATE``,
which sees the latest committed row whatever the caller's snapshot. Retention deletes
expired rows, stepping over locked ones.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ..messages import ClaimedMessage, NewMessage
from ..models import unique_key_id
from .base import connection_for, default_alias, in_transaction, naive_utc, placeholders

UNIQUE_TABLE = "mysqlq_unique_key"

#: The key's row of an enqueue or an ack: made (already expired: nothing taken) when
#: missing; locked either way (an upsert on the primary key locks the row, not a gap).
_TAKE_ROW = "(%s, %s, 0, %s, %s, NULL, UTC_TIMESTAMP(6))"
TAKE_ROWS_SQL = f"""
INSERT INTO {UNIQUE_TABLE} (id, dedup_key, message_id, task_name, queue, succeeded_at,
                            expires_at)
VALUES {{rows}}
ON DUPLICATE KEY UPDATE id = id
"""
#: The ack's lock on its key rows, stepping over those another transaction holds: a
#: producer's open transaction that enqueued the key of a message being acked.
LOCK_FREE_ROWS_SQL = f"SELECT id FROM {UNIQUE_TABLE} WHERE id IN ({{ids}}) FOR UPDATE SKIP LOCKED"
#: Which key rows exist (no lock): tells a row another transaction holds from a missing one.
PRESENT_ROWS_SQL = f"SELECT id FROM {UNIQUE_TABLE} WHERE id IN ({{ids}})"
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


def _keyed(messages: Sequence[Any]) -> list[tuple[str, Any]]:
    """(key row id, message) of the messages with a period, one per key, in key order:
    rows are always locked in that order."""
    keyed = {unique_key_id(m.dedup_key): m for m in messages
             if m.unique_for > 0 and m.dedup_key is not None}
    return sorted(keyed.items(), key=lambda pair: pair[0])


def take_rows(cursor: Any, messages: Sequence[NewMessage | ClaimedMessage]) -> int:
    """Lock the key rows of these messages (those with ``unique_for``), making missing
    ones already expired; return how many. The first statement of an enqueue with
    ``unique_for`` and of an ack of such messages (see the lock order above)."""
    keyed = _keyed(messages)
    if keyed:
        _upsert_rows(cursor, keyed)
    return len(keyed)


def _upsert_rows(cursor: Any, keyed: Sequence[tuple[str, Any]]) -> None:
    params: list[Any] = []
    for key_id, message in keyed:
        params += [key_id, message.dedup_key, message.task_name[-255:], message.queue]
    cursor.execute(TAKE_ROWS_SQL.format(rows=", ".join([_TAKE_ROW] * len(keyed))), params)


def take_free_rows(cursor: Any, messages: Sequence[ClaimedMessage]
                   ) -> tuple[int, set[str | None]]:
    """:func:`take_rows` for an ack that must not wait: lock the key rows no other
    transaction holds (making missing ones), and return how many were locked and the
    dedup keys whose row another transaction holds. Their messages are left out of the
    ack for a moment, as for a busy gate: a producer's open transaction on one key must
    not stall the acks of every other message of the batch."""
    keyed = _keyed(messages)
    if not keyed:
        return 0, set()
    ids = [key_id for key_id, _ in keyed]
    cursor.execute(LOCK_FREE_ROWS_SQL.format(ids=placeholders(len(ids))), ids)
    locked = {str(row[0]) for row in cursor.fetchall()}
    absent = [key_id for key_id in ids if key_id not in locked]
    if absent:
        cursor.execute(PRESENT_ROWS_SQL.format(ids=placeholders(len(absent))), absent)
        present = {str(row[0]) for row in cursor.fetchall()}
        gone = [(key_id, message) for key_id, message in keyed
                if key_id in absent and key_id not in present]
        if gone:  # deleted by retention meanwhile: made again, locked by the upsert
            _upsert_rows(cursor, gone)
            locked.update(key_id for key_id, _ in gone)
    busy = {message.dedup_key for key_id, message in keyed if key_id not in locked}
    return len(locked), busy


def take_key(cursor: Any, message: NewMessage) -> int | None:
    """Inside the enqueue's transaction, before its INSERT: lock the key's row, then
    return the id of the message whose success keeps ``message.dedup_key`` taken, or
    None if no period runs (the caller inserts, still holding the row)."""
    assert message.dedup_key is not None and message.unique_for > 0
    take_rows(cursor, [message])
    cursor.execute(PERIOD_HOLDER_SQL, [unique_key_id(message.dedup_key)])
    row = cursor.fetchone()
    return None if row is None else int(row[0])


def remember(cursor: Any, messages: Sequence[ClaimedMessage]) -> int:
    """Inside an ack's transaction, after its DELETE: keep the keys of these succeeded
    messages taken for their ``unique_for`` seconds (messages without one are left out);
    their rows are already locked (:func:`take_rows`)."""
    keep = _keyed(messages)
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
