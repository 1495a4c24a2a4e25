"""Retention: delete old history in short batches."""

from __future__ import annotations

import datetime as dt

from .base import (
    ATTEMPT_TABLE,
    connection_for,
    default_alias,
    naive_utc,
    require_autocommit,
    with_lock_retry,
)

#: One retention batch: oldest first along mysqlq_att_finished, so each batch is short.
PURGE_SQL = f"""
DELETE FROM {ATTEMPT_TABLE} WHERE finished_at < %s ORDER BY finished_at LIMIT %s
"""
PURGE_COUNT_SQL = f"SELECT COUNT(*) FROM {ATTEMPT_TABLE} WHERE finished_at < %s"


def count_history_before(before: dt.datetime) -> int:
    """History rows that finished before ``before`` (what a purge would delete)."""
    with connection_for().cursor() as cursor:
        cursor.execute(PURGE_COUNT_SQL, [naive_utc(before)])
        return int(cursor.fetchone()[0])


def purge_history_batch(before: dt.datetime, limit: int) -> int:
    """Delete at most ``limit`` history rows finished before ``before``; return how many.

    Autocommit, oldest first: each batch holds its row locks only for its own statement.
    """
    alias = default_alias()
    require_autocommit(alias, "purge_history_batch()")

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(PURGE_SQL, [naive_utc(before), int(limit)])
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)
