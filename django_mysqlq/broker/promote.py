"""Scheduled messages whose time has come become ready, in batches along ``run_at``."""

from __future__ import annotations

from typing import Any

from .base import MESSAGE_TABLE, connection_for, default_alias, in_transaction, placeholders
from .locked import run_around_locks, short_wait

PROMOTE_SQL = f"""
UPDATE {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
   SET status = 'ready'
 WHERE status = 'scheduled' AND run_at <= UTC_TIMESTAMP(6)
 ORDER BY run_at
 LIMIT %s
"""
#: The same rows, stepping over any a stranger has locked (see ``locked``).
DUE_UNLOCKED_SQL = f"""
SELECT id FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
 WHERE status = 'scheduled' AND run_at <= UTC_TIMESTAMP(6)
 ORDER BY run_at
 LIMIT %s
   FOR UPDATE SKIP LOCKED
"""
PROMOTE_IDS_SQL = f"""
UPDATE {MESSAGE_TABLE} SET status = 'ready' WHERE id IN ({{ids}}) AND status = 'scheduled'
"""


def promote_due(limit: int = 1000, alias: str | None = None) -> int:
    """Turn scheduled messages whose time has come into ready ones; return how many."""
    alias = alias or default_alias()
    connection = connection_for(alias)

    def fast() -> int:
        with connection.cursor() as cursor:
            cursor.execute(short_wait(connection, PROMOTE_SQL), [limit])
            return int(cursor.rowcount)

    def body(cursor: Any) -> int:
        cursor.execute(DUE_UNLOCKED_SQL, [limit])
        ids = [int(row[0]) for row in cursor.fetchall()]
        if not ids:
            return 0
        cursor.execute(PROMOTE_IDS_SQL.format(ids=placeholders(len(ids))), ids)
        return int(cursor.rowcount)

    return run_around_locks(alias, (alias, "promotion of due messages"),
                            "Promotion of due messages", fast,
                            lambda: in_transaction(alias, body))
