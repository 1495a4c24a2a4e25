"""Global rate limits: a rate-limited message is claimed only when its key's row allows.

A message with a rate key never becomes 'ready': it waits 'throttled' (``RUNNABLE_STATUS``
everywhere a message becomes runnable), out of the claim index's 'ready' range, so other
messages of its queue are claimed as if it were not there (no head-of-line blocking).
Workers whose code declares rate-limited tasks also run :func:`claim_throttled`: for each
key of their queues whose ``next_at`` has come, one short transaction locks the key's row
(stepping over a row another worker holds), claims the key's oldest throttled message
under the same token scheme as an ordinary claim, and moves ``next_at`` to one interval
past the later of itself and now. So two starts of a key are at least one interval apart
across all workers, and no window of ``interval * N`` holds more than N of them. A worker
that dies after its claim leaks nothing: recovery makes the message throttled again, and
the row only ever says when the next start may be. A parked worker's park ends when the
earliest ``next_at`` of a key with throttled messages comes (``park.RATE_WAIT``): no polling.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from ..messages import ClaimedMessage, NewMessage
from ..models import MessageStatus, rate_id
from .base import (
    DEADLOCK,
    MESSAGE_TABLE,
    connection_for,
    default_alias,
    in_transaction,
    lock_waits_final,
    micros,
    naive_utc,
    placeholders,
    require_autocommit,
    with_lock_retry,
)
from .claim import give_back_tokens, read_claimed_messages
from .lockwait import bounded_lock_waits, bounded_statement
from .park import CLAIMABLE_IN_KEY, RATE_TABLE
from .session import connection_session

#: Which of these keys have a row (a plain read: no lock, so an open producer never holds
#: up the claims of its key nor another producer).
EXISTING_KEYS_SQL = f"SELECT id FROM {RATE_TABLE} WHERE id IN ({{ids}})"
#: The rows of keys new to the table (``next_at`` now: nothing holds a new key back).
#: ``INSERT IGNORE``: a row a concurrent producer made meanwhile is left as it is.
ENSURE_SQL = f"""
INSERT IGNORE INTO {RATE_TABLE} (id, queue, rate_key, rate_limit, next_at, changed_at)
VALUES {{rows}}
"""
_ENSURE_ROW = "(%s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
#: The longest spacing a key's row takes (a week: the longest window of one start).
INTERVAL_MAX_MICROS = 7 * 86400 * 1_000_000

#: Keys of these queues whose next start may be now and that have a message to start.
#: A key whose messages all ran keeps its row, and its old ``next_at``, for an hour
#: (``IDLE_KEY_SECONDS``): counted, such keys would fill the LIMIT ahead of a new key.
DUE_KEYS_SQL = f"""
SELECT r.id, r.queue, r.rate_key FROM {RATE_TABLE} AS r FORCE INDEX (mysqlq_rate_due)
 WHERE r.queue IN ({{queues}}) AND r.next_at <= UTC_TIMESTAMP(6)
   AND {CLAIMABLE_IN_KEY}
 ORDER BY r.next_at
 LIMIT %s
"""
#: Seconds until the soonest next start of a key of these queues that has throttled
#: messages this worker may claim (NULL: none waits), for a busy worker's pause between
#: claims: a key due with only messages it leaves alone would make that pause nil.
NEXT_START_SQL = f"""
SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(r.next_at)) / 1000000
  FROM {RATE_TABLE} AS r FORCE INDEX (mysqlq_rate_due)
 WHERE r.queue IN ({{queues}}) AND {CLAIMABLE_IN_KEY}
"""
#: The key's row, if its next start may be now and no other worker holds it.
LOCK_KEY_SQL = f"""
SELECT 1 FROM {RATE_TABLE} WHERE id = %s AND next_at <= UTC_TIMESTAMP(6)
   FOR UPDATE SKIP LOCKED
"""
#: The key's oldest throttled message (enqueue order within a key). One lost with a worker
#: before runs alone in its process (``worker.gate``), so it would start only once the
#: process's other tasks end, long after its claim took the key's start: only a worker
#: with nothing running takes it (the last parameter), so a start follows its claim.
NEXT_THROTTLED_SQL = f"""
SELECT id, rate_interval FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_rate)
 WHERE rate_key = %s AND queue = %s AND status = '{MessageStatus.THROTTLED}'
   AND (losses = 0 OR %s)
 ORDER BY id
 LIMIT 1
   FOR UPDATE SKIP LOCKED
"""
#: The claim of that message (the same columns as ``claim._CLAIM_SET``).
CLAIM_THROTTLED_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'claimed', claim_token = %s, owner_connection = IF(%s, CONNECTION_ID(), NULL),
       owner_server_start = %s, worker_id = %s, claimed_at = UTC_TIMESTAMP(6),
       lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, started_at = NULL,
       attempts = IF(attempts < 4294967295, attempts + 1, attempts)
 WHERE id = %s AND status = '{MessageStatus.THROTTLED}'
"""
#: The key's next start: one interval past the later of its due time and now.
ADVANCE_SQL = f"""
UPDATE {RATE_TABLE}
   SET next_at = GREATEST(next_at, UTC_TIMESTAMP(6)) + INTERVAL %s MICROSECOND,
       changed_at = UTC_TIMESTAMP(6)
 WHERE id = %s
"""
#: Keys without messages whose next start has passed, for retention (stepping over rows
#: a producer or a claim holds) ...
IDLE_KEYS_SQL = f"""
SELECT r.id FROM {RATE_TABLE} AS r
 WHERE r.next_at < %s
   AND NOT EXISTS (SELECT 1 FROM {MESSAGE_TABLE} AS m FORCE INDEX (mysqlq_msg_rate)
                    WHERE m.rate_key = r.rate_key AND m.queue = r.queue)
 LIMIT %s
   FOR UPDATE SKIP LOCKED
"""
DELETE_KEYS_SQL = f"DELETE FROM {RATE_TABLE} WHERE id IN ({{ids}})"
#: A key's row as SQL computes it (``models.rate_id``: the same digest of the same bytes).
_SQL_RATE_ID = "LEFT(SHA2(CONCAT(m.queue, CHAR(0), m.rate_key), 256), 32)"
#: The rows of keys whose throttled messages have none (a row deleted by hand): without
#: a row a key's messages would never be claimed. Run by the recovery leader.
REPAIR_KEYS_SQL = f"""
INSERT INTO {RATE_TABLE} (id, queue, rate_key, rate_limit, next_at, changed_at)
SELECT DISTINCT {_SQL_RATE_ID}, m.queue, m.rate_key, '', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)
  FROM {MESSAGE_TABLE} AS m FORCE INDEX (mysqlq_msg_rate)
 WHERE m.rate_key IS NOT NULL AND m.status = '{MessageStatus.THROTTLED}'
   AND NOT EXISTS (SELECT 1 FROM {RATE_TABLE} AS r WHERE r.id = {_SQL_RATE_ID})
ON DUPLICATE KEY UPDATE changed_at = {RATE_TABLE}.changed_at
"""


def ensure_keys(cursor: Any, messages: Sequence[NewMessage]) -> None:
    """In the enqueue's transaction: make the rows these messages' rate keys lack.

    Keys that have a row are only read: their producers lock nothing of the key. A new
    key's row is inserted in sorted order; two transactions that each make new keys, in
    opposite orders across several enqueue calls, may deadlock as any two inserting
    transactions can (one gets error 1213 and is rolled back). Retention deletes a row
    only after its key has been idle for ``IDLE_KEY_SECONDS``, and the recovery leader
    makes any row a key with throttled messages lacks (:func:`repair_rate_keys`).
    """
    keys = sorted({(rate_id(m.queue, m.rate_key), m.queue, m.rate_key, m.rate_limit)
                   for m in messages if m.rate_key is not None})
    if not keys:
        return
    cursor.execute(EXISTING_KEYS_SQL.format(ids=placeholders(len(keys))),
                   [key[0] for key in keys])
    existing = {str(row[0]) for row in cursor.fetchall()}
    new = [key for key in keys if key[0] not in existing]
    if new:
        cursor.execute(ENSURE_SQL.format(rows=", ".join([_ENSURE_ROW] * len(new))),
                       [value for key in new for value in key])


def claim_throttled(queues: Sequence[str], limit: int, worker_id: str, lease_seconds: float,
                    alias: str | None = None, *, idle: bool = True,
                    lock_wait: int | None = None) -> list[ClaimedMessage]:
    """Claim up to ``limit`` throttled messages whose keys' next start has come, one per
    key and per transaction; return them like :func:`claim.claim` does. A worker that
    runs something (not ``idle``) leaves messages lost before to an idle one.

    With ``lock_wait`` the claim waits at most that many seconds for the rate keys' table
    (a stranger's ``LOCK TABLES``, an ``ALTER``) and raises the lock-wait timeout at once
    (``is_lock_wait``): the worker's plain claims must not wait behind it.
    """
    alias = alias or default_alias()
    require_autocommit(alias, "claim_throttled()")
    if not queues or limit <= 0:
        return []
    if lock_wait is None:
        return _claim_throttled(queues, limit, worker_id, lease_seconds, alias, idle, None)
    if connection_for(alias).mysql_is_mariadb:  # type: ignore[attr-defined]
        final = lock_waits_final(True)  # (each statement bounds its own wait)
        try:
            return _claim_throttled(queues, limit, worker_id, lease_seconds, alias, idle,
                                    lock_wait)
        finally:
            lock_waits_final(final)
    with bounded_lock_waits(lock_wait, alias):  # MySQL: no statement-scoped variables
        return _claim_throttled(queues, limit, worker_id, lease_seconds, alias, idle, None)


def _claim_throttled(queues: Sequence[str], limit: int, worker_id: str,
                     lease_seconds: float, alias: str, idle: bool,
                     lock_wait: int | None) -> list[ClaimedMessage]:
    """:func:`claim_throttled`'s work; ``lock_wait`` bounds its statements' waits for the
    tables' metadata locks one by one (MariaDB)."""
    connection = connection_for(alias)
    session = connection_session(alias)
    token = uuid.uuid4().hex
    stamp = [token, session.stamps_owner, session.owner_start, worker_id,
             micros(lease_seconds)]
    due_sql = bounded_statement(
        connection, DUE_KEYS_SQL.format(queues=placeholders(len(queues))), lock_wait)
    lock_sql = bounded_statement(connection, LOCK_KEY_SQL, lock_wait)

    def due_keys() -> list[tuple[str, str, str]]:
        with connection.cursor() as cursor:
            cursor.execute(due_sql, [*queues, idle, limit * 4])
            return [(str(row[0]), str(row[1]), str(row[2])) for row in cursor.fetchall()]

    # (A producer's late wake-up, KILL QUERY, landing here is retried like a deadlock. A
    # lock wait can only be a table's metadata lock here: the read locks no row.)
    keys = with_lock_retry(alias, due_keys, codes=frozenset({DEADLOCK}))
    taken = 0
    for key_id, queue, rate_key in keys:
        if taken >= limit:
            break

        def body(cursor: Any, key_id: str = key_id, queue: str = queue,
                 rate_key: str = rate_key) -> int:
            cursor.execute(lock_sql, [key_id])
            if cursor.fetchone() is None:
                return 0  # another worker holds it, or its time moved on
            cursor.execute(NEXT_THROTTLED_SQL, [rate_key, queue, idle])
            row = cursor.fetchone()
            if row is None:
                return 0
            cursor.execute(CLAIM_THROTTLED_SQL, [*stamp, int(row[0])])
            if not cursor.rowcount:
                return 0
            # (A spacing changed by hand can't push next_at past the column's range.)
            cursor.execute(ADVANCE_SQL, [min(int(row[1] or 0), INTERVAL_MAX_MICROS), key_id])
            return 1

        try:
            taken += in_transaction(alias, body)
        except DatabaseError:
            if taken:  # the keys claimed before are nobody's otherwise: give them back
                give_back_tokens(alias, [token], taken, "earlier rate keys")
            raise
    return (read_claimed_messages(alias, token, taken, "the rate-limited keys")
            if taken else [])


#: Seconds a key without messages keeps its row (its next start past): retention then
#: deletes it. Long, so that a producer that read the row just before is not left without.
IDLE_KEY_SECONDS = 3600


def seconds_to_next_start(queues: Sequence[str], lock_wait: int | None = None, *,
                          idle: bool = True) -> float | None:
    """Seconds until a key of these queues may start its next throttled message (0 or
    less: now), or None when no message is throttled: a worker running tasks pauses
    between claims until then rather than by its growing poll interval. Not ``idle``,
    messages it would leave to an idle worker don't count (``claim_throttled``).
    ``lock_wait`` bounds the wait for the tables' metadata locks (MariaDB; see
    ``claim_throttled``)."""
    if not queues:
        return None
    connection = connection_for(default_alias())
    with connection.cursor() as cursor:
        cursor.execute(bounded_statement(
            connection, NEXT_START_SQL.format(queues=placeholders(len(queues))), lock_wait),
            [*queues, idle])
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


def purge_idle_rate_keys(before: Any, limit: int) -> int:
    """Delete up to ``limit`` rows of keys with no message left whose next start was before
    ``before``; return how many (retention)."""
    alias = default_alias()
    cutoff = naive_utc(before)

    def body(cursor: Any) -> int:
        cursor.execute(IDLE_KEYS_SQL, [cutoff, limit])
        ids = [str(row[0]) for row in cursor.fetchall()]
        if not ids:
            return 0
        cursor.execute(DELETE_KEYS_SQL.format(ids=placeholders(len(ids))), ids)
        return int(cursor.rowcount)

    return in_transaction(alias, body)


def repair_rate_keys() -> int:
    """Make the missing rows of keys that have throttled messages; return how many."""
    def body(cursor: Any) -> int:
        cursor.execute(REPAIR_KEYS_SQL)
        return int(cursor.rowcount)

    return in_transaction(default_alias(), body)
