"""Scheduled messages whose time has come become ready, in batches along ``run_at``."""

from __future__ import annotations

from .base import MESSAGE_TABLE, connection_for, default_alias, with_lock_retry

PROMOTE_SQL = f"""
UPDATE {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
   SET status = 'ready'
 WHERE status = 'scheduled' AND run_at <= UTC_TIMESTAMP(6)
 ORDER BY run_at
 LIMIT %s
"""


def promote_due(limit: int = 1000, alias: str | None = None) -> int:
    """Turn scheduled messages whose time has come into ready ones; return how many."""
    alias = alias or default_alias()

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(PROMOTE_SQL, [limit])
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)

