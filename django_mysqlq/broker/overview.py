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

#: The first entry of the claim index: the smallest (queue, status, priority) group, and
#: its smallest id (ids rise within a group).
FIRST_GROUP_SQL = f"""
SELECT queue, status, priority, id FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
 ORDER BY queue, status, priority DESC, id LIMIT 1
"""
#: The first entry of the group after (queue, status, priority): one index dive per group.
#: A skip scan by hand: MariaDB's loose index scan refuses an index with a descending
#: part, so ``GROUP BY queue, status, priority`` would read every entry of a big backlog.
NEXT_GROUP_SQL = f"""
SELECT queue, status, priority, id FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
 WHERE queue > %s OR (queue = %s AND (status > %s OR (status = %s AND priority < %s)))
 ORDER BY queue, status, priority DESC, id LIMIT 1
"""
#: The first queue name after %s (the same skip scan, on the index's first column).
FIRST_QUEUE_SQL = f"""
SELECT queue FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX}) ORDER BY queue LIMIT 1
"""
NEXT_QUEUE_SQL = f"""
SELECT queue FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
 WHERE queue > %s ORDER BY queue LIMIT 1
"""
#: Messages of one queue and status, counted along the claim index up to %s rows: one arm
#: of a ``UNION ALL``, labelled with its queue and status.
QUEUE_STATUS_COUNT_SQL = f"""
SELECT %s, %s, COUNT(*) FROM (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
                               WHERE queue = %s AND status = %s LIMIT %s) AS counted
"""
#: Messages in one status, counted along mysqlq_msg_due up to %s rows (one arm likewise).
STATUS_COUNT_SQL = f"""
SELECT %s, COUNT(*) FROM (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
                           WHERE status = %s LIMIT %s) AS counted
"""
ENQUEUED_AT_SQL = f"SELECT id, enqueued_at FROM {MESSAGE_TABLE} WHERE id IN ({{ids}})"
#: LIMIT of an uncapped count: every row.
_NO_CAP = 2**63 - 1
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
    """Unfinished messages of a queue by status, and when its oldest ready one was queued.

    A count in ``capped`` stopped at the cap it was read with: there are more.
    """

    counts: dict[str, int]
    oldest_ready_at: dt.datetime | None
    capped: frozenset[str] = frozenset()


def _groups(cursor: Any) -> list[tuple[str, str, int, int]]:
    """Every (queue, status, priority) of unfinished messages with its smallest id."""
    cursor.execute(FIRST_GROUP_SQL)
    row = cursor.fetchone()
    groups = []
    while row is not None:
        queue, status, priority, first_id = str(row[0]), str(row[1]), int(row[2]), int(row[3])
        groups.append((queue, status, priority, first_id))
        cursor.execute(NEXT_GROUP_SQL, [queue, queue, status, status, priority])
        row = cursor.fetchone()
    return groups


def _limit(cap: int | None) -> int:
    return _NO_CAP if cap is None else cap + 1


def queue_overview(cap: int | None = None) -> dict[str, QueueOverview]:
    """Per queue: counts by status and the enqueue time of the oldest ready message.

    With ``cap``, each count stops after ``cap`` + 1 index entries, so a page showing it
    costs the same at a million messages as at a thousand (the admin's dashboard); without
    it, counts are exact and cost a walk of the whole claim index (``queuestats``).
    """
    limit = _limit(cap)
    with connection_for().cursor() as cursor:
        groups = _groups(cursor)
        pairs = sorted({(queue, status) for queue, status, _, _ in groups})
        counted: list[tuple[str, str, int]] = []
        if pairs:
            cursor.execute(" UNION ALL ".join([QUEUE_STATUS_COUNT_SQL] * len(pairs)),
                           [p for q, s in pairs for p in (q, s, q, s, limit)])
            counted = [(str(q), str(s), int(n)) for q, s, n in cursor.fetchall()]
        oldest_id: dict[str, int] = {}
        for queue, status, _, first_id in groups:
            if status == MessageStatus.READY:
                oldest_id[queue] = min(first_id, oldest_id.get(queue, first_id))
        oldest_ids = {message_id: queue for queue, message_id in oldest_id.items()}
        oldest: dict[str, dt.datetime] = {}
        if oldest_ids:
            cursor.execute(ENQUEUED_AT_SQL.format(ids=placeholders(len(oldest_ids))),
                           list(oldest_ids))
            for message_id, enqueued_at in cursor.fetchall():
                if timezone.is_naive(enqueued_at):
                    enqueued_at = enqueued_at.replace(tzinfo=dt.UTC)
                oldest[oldest_ids[int(message_id)]] = enqueued_at
    counts: dict[str, dict[str, int]] = {}
    capped: dict[str, set[str]] = {}
    for queue, status, count in counted:
        if cap is not None and count > cap:
            count = cap
            capped.setdefault(queue, set()).add(status)
        counts.setdefault(queue, {})[status] = count
    return {queue: QueueOverview(by_status, oldest.get(queue),
                                 frozenset(capped.get(queue, ())))
            for queue, by_status in counts.items()}


def status_counts(statuses: Sequence[str], cap: int) -> dict[str, tuple[int, bool]]:
    """``{status: (count, capped)}`` over all queues, each count stopping at ``cap``."""
    with connection_for().cursor() as cursor:
        cursor.execute(" UNION ALL ".join([STATUS_COUNT_SQL] * len(statuses)),
                       [p for status in statuses for p in (status, status, cap + 1)])
        rows = cursor.fetchall()
    return {str(status): (min(int(count), cap), int(count) > cap) for status, count in rows}


def queue_names(limit: int = 200) -> list[str]:
    """Names of the queues holding unfinished messages, in order: one index dive each."""
    names: list[str] = []
    with connection_for().cursor() as cursor:
        cursor.execute(FIRST_QUEUE_SQL)
        row = cursor.fetchone()
        while row is not None and len(names) < limit:
            names.append(str(row[0]))
            cursor.execute(NEXT_QUEUE_SQL, [names[-1]])
            row = cursor.fetchone()
    return names


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

