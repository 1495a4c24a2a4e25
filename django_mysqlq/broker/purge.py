"""Retention: delete old history, old dead messages and old worker rows in short batches.

Each batch walks an index oldest first and is its own short transaction, so it holds
its locks briefly and can run while workers are busy.
"""

from __future__ import annotations

import datetime as dt

from ..models import MessageStatus
from .base import (
    ATTEMPT_TABLE,
    MESSAGE_TABLE,
    WORKER_TABLE,
    connection_for,
    default_alias,
    naive_utc,
    require_autocommit,
    with_lock_retry,
)
from .operate import Operator, cancel

#: One retention batch: oldest first along mysqlq_att_finished, so each batch is short.
PURGE_SQL = f"""
DELETE FROM {ATTEMPT_TABLE} WHERE finished_at < %s ORDER BY finished_at LIMIT %s
"""
PURGE_COUNT_SQL = f"SELECT COUNT(*) FROM {ATTEMPT_TABLE} WHERE finished_at < %s"

#: Dead messages that died before a time, oldest first along mysqlq_msg_due (a dead
#: message's run_at is when it died). Read without locks: cancel() locks them and
#: re-checks that they are still dead (not their age: one requeued and dead again in
#: that instant goes too, its arguments kept in history).
DEAD_BEFORE_SQL = f"""
SELECT id FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
 WHERE status = 'dead' AND run_at < %s
 ORDER BY run_at
 LIMIT %s
"""
DEAD_COUNT_SQL = f"""
SELECT COUNT(*) FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
 WHERE status = 'dead' AND run_at < %s
"""
#: The history row each purged dead message gets (outcome ``cancelled``, payload kept).
DEAD_PURGED_NOTE = "dead message purged"

#: Rows of stopped workers (a stale one is marked stopped by the recovery leader first)
#: last heard from before a time, oldest first along mysqlq_wrk_heartbeat.
PURGE_WORKERS_SQL = f"""
DELETE FROM {WORKER_TABLE}
 WHERE last_heartbeat < %s AND stopped_at IS NOT NULL
 ORDER BY last_heartbeat
 LIMIT %s
"""
WORKERS_COUNT_SQL = f"""
SELECT COUNT(*) FROM {WORKER_TABLE} FORCE INDEX (mysqlq_wrk_heartbeat)
 WHERE last_heartbeat < %s AND stopped_at IS NOT NULL
"""


def _count(sql: str, before: dt.datetime) -> int:
    with connection_for().cursor() as cursor:
        cursor.execute(sql, [naive_utc(before)])
        return int(cursor.fetchone()[0])


def count_history_before(before: dt.datetime) -> int:
    """History rows that finished before ``before`` (what a purge would delete)."""
    return _count(PURGE_COUNT_SQL, before)


def count_dead_before(before: dt.datetime) -> int:
    """Dead messages that died before ``before``."""
    return _count(DEAD_COUNT_SQL, before)


def count_workers_before(before: dt.datetime) -> int:
    """Stopped workers' rows last heard from before ``before``."""
    return _count(WORKERS_COUNT_SQL, before)


def _delete_batch(sql: str, before: dt.datetime, limit: int, what: str) -> int:
    """One autocommit ``DELETE … ORDER BY … LIMIT``; how many rows it deleted."""
    alias = default_alias()
    require_autocommit(alias, what)

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(sql, [naive_utc(before), int(limit)])
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)


def purge_history_batch(before: dt.datetime, limit: int) -> int:
    """Delete at most ``limit`` history rows finished before ``before``; return how many.

    Autocommit, oldest first: each batch holds its row locks only for its own statement.
    """
    return _delete_batch(PURGE_SQL, before, limit, "purge_history_batch()")


def purge_workers_batch(before: dt.datetime, limit: int) -> int:
    """Delete at most ``limit`` rows of workers stopped and silent since before ``before``."""
    return _delete_batch(PURGE_WORKERS_SQL, before, limit, "purge_workers_batch()")


def purge_dead_batch(before: dt.datetime, limit: int, operator: Operator) -> int:
    """Delete at most ``limit`` dead messages that died before ``before``; return how many.

    Each gets a ``cancelled`` history row naming ``operator``, with the note
    :data:`DEAD_PURGED_NOTE` and its arguments (so it can still be replayed), written
    in the transaction that deletes it, as :func:`cancel` does.
    """
    alias = default_alias()
    require_autocommit(alias, "purge_dead_batch()")
    with connection_for(alias).cursor() as cursor:
        cursor.execute(DEAD_BEFORE_SQL, [naive_utc(before), int(limit)])
        ids = [int(row[0]) for row in cursor.fetchall()]
    return len(cancel(ids, operator, note=DEAD_PURGED_NOTE, statuses=(MessageStatus.DEAD,)))
