"""The workers table: register, heartbeat, deregister, and mark the silent ones stopped."""

from __future__ import annotations

from collections.abc import Sequence

from ..conf import get_settings
from .base import WORKER_TABLE, connection_for, default_alias, micros, with_lock_retry

REGISTER_WORKER_SQL = f"""
INSERT INTO {WORKER_TABLE}
       (id, host, pid, queues, concurrency, connection_id, started_at, last_heartbeat,
        stopped_at, processed, failed)
VALUES (%s, %s, %s, %s, %s, CONNECTION_ID(), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL, 0, 0)
ON DUPLICATE KEY UPDATE last_heartbeat = UTC_TIMESTAMP(6), stopped_at = NULL, listening = 0,
       connection_id = CONNECTION_ID(), troubles = ''
"""
HEARTBEAT_WORKER_SQL = f"""
UPDATE {WORKER_TABLE}
   SET last_heartbeat = UTC_TIMESTAMP(6), connection_id = CONNECTION_ID(),
       processed = %s, failed = %s, stopped_at = NULL, listening = %s, troubles = %s
 WHERE id = %s
"""
STOP_WORKER_SQL = f"""
UPDATE {WORKER_TABLE}
   SET stopped_at = UTC_TIMESTAMP(6), listening = 0, processed = %s, failed = %s,
       troubles = ''
 WHERE id = %s
"""
MARK_STALE_WORKERS_SQL = f"""
UPDATE {WORKER_TABLE}
   SET stopped_at = last_heartbeat
 WHERE stopped_at IS NULL AND last_heartbeat < UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND
"""


def register_worker(worker_id: str, host: str, pid: int, queues: Sequence[str],
                    concurrency: int) -> None:
    with connection_for().cursor() as cursor:
        cursor.execute(REGISTER_WORKER_SQL,
                       [worker_id, host[:255], pid, ",".join(queues), concurrency])


def heartbeat_worker(worker_id: str, processed: int, failed: int,
                     listening: bool = False, troubles: str = "") -> None:
    """Say the worker is alive, with its counters and what keeps failing in it now
    (``troubles``: one line each, empty when nothing does)."""
    def run() -> None:
        with connection_for().cursor() as cursor:
            cursor.execute(HEARTBEAT_WORKER_SQL,
                           [processed, failed, listening, troubles, worker_id])

    with_lock_retry(default_alias(), run)


def deregister_worker(worker_id: str, processed: int, failed: int) -> None:
    with connection_for().cursor() as cursor:
        cursor.execute(STOP_WORKER_SQL, [processed, failed, worker_id])


def mark_stale_workers(alias: str | None = None) -> int:
    """Mark workers whose heartbeat is older than a lease as stopped; return how many."""
    with connection_for(alias).cursor() as cursor:
        cursor.execute(MARK_STALE_WORKERS_SQL, [micros(get_settings().LEASE_SECONDS)])
        return int(cursor.rowcount)

