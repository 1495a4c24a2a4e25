"""Read-only views of the queue for the dashboard, the CLI and burst workers."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.utils import timezone

from ..conf import get_settings
from ..models import ATTEMPT_OUTCOMES, CLAIM_INDEX, MessageStatus
from .base import (
    ATTEMPT_TABLE,
    MESSAGE_TABLE,
    WORKER_TABLE,
    connection_for,
    micros,
    placeholders,
)

#: Per queue and status: count, and the smallest id (the oldest ready message). Covered
#: by the claim index, whose prefix is exactly (queue, status).
OVERVIEW_SQL = f"""
SELECT queue, status, COUNT(*), MIN(id)
  FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
 GROUP BY queue, status
"""
ENQUEUED_AT_SQL = f"SELECT id, enqueued_at FROM {MESSAGE_TABLE} WHERE id IN ({{ids}})"
#: History of the last %s minutes, bucketed by minutes ago: a range of mysqlq_att_finished.
HISTORY_WINDOW_SQL = f"""
SELECT queue, task_name, outcome,
       TIMESTAMPDIFF(MINUTE, finished_at, UTC_TIMESTAMP(6)) AS minutes_ago, COUNT(*)
  FROM {ATTEMPT_TABLE} FORCE INDEX (mysqlq_att_finished)
 WHERE finished_at >= UTC_TIMESTAMP(6) - INTERVAL %s MINUTE
 GROUP BY queue, task_name, outcome, minutes_ago
"""
WORKERS_ALIVE_SQL = f"""
SELECT COUNT(*) FROM {WORKER_TABLE} FORCE INDEX (mysqlq_wrk_heartbeat)
 WHERE last_heartbeat > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND AND stopped_at IS NULL
"""


ESTIMATED_ROWS_SQL = """
SELECT TABLE_ROWS FROM information_schema.TABLES
 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s
"""



def queue_counts(queues: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """``{queue: {status: count}}`` of unfinished messages."""
    sql = f"SELECT queue, status, COUNT(*) FROM {MESSAGE_TABLE}"
    params: list[Any] = []
    if queues:
        sql += " WHERE queue IN (" + ", ".join(["%s"] * len(queues)) + ")"
        params = list(queues)
    sql += " GROUP BY queue, status"
    counts: dict[str, dict[str, int]] = {}
    with connection_for().cursor() as cursor:
        cursor.execute(sql, params)
        for queue, status, count in cursor.fetchall():
            counts.setdefault(queue, {})[status] = int(count)
    return counts


def has_pending(queues: Sequence[str], scheduled_within: float) -> bool:
    """Whether these queues hold ready or claimed messages, or scheduled ones due soon.

    ``--burst`` workers stop when this turns false; retries due within
    ``scheduled_within`` seconds still count as work to wait for.
    """
    placeholders = ", ".join(["%s"] * len(queues))
    with connection_for().cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {MESSAGE_TABLE} WHERE queue IN ({placeholders}) AND "
            "(status IN (%s, %s) OR (status = %s AND "
            "run_at <= UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)) LIMIT 1",
            [*queues, MessageStatus.READY, MessageStatus.CLAIMED, MessageStatus.SCHEDULED,
             micros(scheduled_within)],
        )
        return cursor.fetchone() is not None



@dataclasses.dataclass(frozen=True)
class QueueOverview:
    """Unfinished messages of a queue by status, and when its oldest ready one was queued."""

    counts: dict[str, int]
    oldest_ready_at: dt.datetime | None


def queue_overview() -> dict[str, QueueOverview]:
    """Per queue: counts by status and the enqueue time of the oldest ready message."""
    with connection_for().cursor() as cursor:
        cursor.execute(OVERVIEW_SQL)
        rows = cursor.fetchall()
        oldest_ids = {int(row[3]): str(row[0]) for row in rows
                      if row[1] == MessageStatus.READY}
        oldest: dict[str, dt.datetime] = {}
        if oldest_ids:
            cursor.execute(ENQUEUED_AT_SQL.format(ids=placeholders(len(oldest_ids))),
                           list(oldest_ids))
            for message_id, enqueued_at in cursor.fetchall():
                if timezone.is_naive(enqueued_at):
                    enqueued_at = enqueued_at.replace(tzinfo=dt.UTC)
                oldest[oldest_ids[int(message_id)]] = enqueued_at
    counts: dict[str, dict[str, int]] = {}
    for queue, status, count, _ in rows:
        counts.setdefault(str(queue), {})[str(status)] = int(count)
    return {queue: QueueOverview(by_status, oldest.get(queue))
            for queue, by_status in counts.items()}


@dataclasses.dataclass(frozen=True)
class HistoryBucket:
    """History rows of one queue, task and outcome that finished ``minutes_ago`` minutes ago."""

    queue: str
    task_name: str
    outcome: str
    minutes_ago: int
    count: int


def history_window(minutes: int = 60) -> list[HistoryBucket]:
    """Attempts finished in the last ``minutes``, counted per queue, task, outcome, minute."""
    with connection_for().cursor() as cursor:
        cursor.execute(HISTORY_WINDOW_SQL, [int(minutes)])
        return [HistoryBucket(str(q), str(t), str(o), int(m), int(c))
                for q, t, o, m, c in cursor.fetchall() if o in ATTEMPT_OUTCOMES]


def workers_alive() -> int:
    """Workers that sent a heartbeat within a lease and have not stopped."""
    with connection_for().cursor() as cursor:
        cursor.execute(WORKERS_ALIVE_SQL, [micros(get_settings().LEASE_SECONDS)])
        return int(cursor.fetchone()[0])


def estimated_history_rows() -> int:
    """The server's estimate of the history's size: free, where COUNT(*) reads it all."""
    with connection_for().cursor() as cursor:
        cursor.execute(ESTIMATED_ROWS_SQL, [ATTEMPT_TABLE])
        row = cursor.fetchone()
    return int(row[0] or 0) if row else 0

