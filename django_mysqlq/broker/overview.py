"""Read-only views of the queue for the dashboard, the CLI and burst workers."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import OperationalError
from django.utils import timezone

from ..conf import QueueSettings, get_settings
from ..models import ATTEMPT_OUTCOMES, CLAIM_INDEX, MessageStatus
from .base import (
    ATTEMPT_TABLE,
    MESSAGE_TABLE,
    WORKER_TABLE,
    connection_for,
    error_code,
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

#: Live workers whose row says something keeps failing in them (``troubles``, written at
#: each heartbeat; few rows: the table has one per worker process).
WORKER_TROUBLES_SQL = f"""
SELECT id, troubles FROM {WORKER_TABLE}
 WHERE last_heartbeat > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND AND stopped_at IS NULL
   AND troubles <> ''
 ORDER BY id
"""


#: InnoDB's history list length: committed changes whose undo InnoDB has not purged yet.
#: MariaDB has it as a status variable, readable without any privilege.
HISTORY_LENGTH_SQL = "SHOW GLOBAL STATUS LIKE 'Innodb_history_list_length'"
#: The same figure where that variable is missing (MySQL 8); needs the PROCESS privilege.
HISTORY_LENGTH_METRIC_SQL = """
SELECT `COUNT` FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'
"""
#: The longest-open InnoDB transaction, with its age in seconds and whose it is (the user
#: and host only when its process list row is visible). ``trx_started`` is the server's
#: *system* local time (InnoDB fills it with localtime_r, whatever the session's
#: time_zone), so it is converted from 'SYSTEM' to UTC and compared with UTC on the server.
#: Needs the PROCESS privilege.
OLDEST_TRANSACTION_SQL = """
SELECT trx.trx_mysql_thread_id,
       TIMESTAMPDIFF(SECOND, CONVERT_TZ(trx.trx_started, 'SYSTEM', '+00:00'),
                     UTC_TIMESTAMP()),
       COALESCE(proc.USER, ''), COALESCE(proc.HOST, '')
  FROM information_schema.INNODB_TRX AS trx
  LEFT JOIN information_schema.PROCESSLIST AS proc ON proc.ID = trx.trx_mysql_thread_id
 ORDER BY trx.trx_started, trx.trx_id
 LIMIT 1
"""
#: Unfinished messages by queue and status: of every queue, or of the queues in ``{queues}``.
ALL_QUEUE_COUNTS_SQL = f"SELECT queue, status, COUNT(*) FROM {MESSAGE_TABLE} GROUP BY queue, status"
QUEUE_COUNTS_SQL = f"""
SELECT queue, status, COUNT(*) FROM {MESSAGE_TABLE} WHERE queue IN ({{queues}})
 GROUP BY queue, status
"""
#: Any ready or claimed message in the queues in ``{queues}``, or a scheduled one due
#: within %s microseconds: whether a burst worker still has work to wait for.
HAS_PENDING_SQL = f"""
SELECT 1 FROM {MESSAGE_TABLE} WHERE queue IN ({{queues}})
   AND (status IN (%s, %s, %s)
        OR (status = %s AND run_at <= UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND))
 LIMIT 1
"""
#: Whether queue %s holds a message in status %s, labelled with the queue: one dive into
#: the claim index, one arm of a ``UNION ALL``.
QUEUE_HOLDS_SQL = f"""
SELECT %s, EXISTS(SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
                   WHERE queue = %s AND status = %s LIMIT 1)
"""
#: "Access denied; you need the PROCESS privilege", and "SELECT command denied".
_NO_PRIVILEGE = frozenset({1227, 1142})


def queue_counts(queues: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """``{queue: {status: count}}`` of unfinished messages."""
    sql = QUEUE_COUNTS_SQL.format(queues=placeholders(len(queues))) if queues \
        else ALL_QUEUE_COUNTS_SQL
    params: list[Any] = list(queues or ())
    counts: dict[str, dict[str, int]] = {}
    with connection_for().cursor() as cursor:
        cursor.execute(sql, params)
        for queue, status, count in cursor.fetchall():
            counts.setdefault(queue, {})[status] = int(count)
    return counts


def has_pending(queues: Sequence[str], scheduled_within: float, *,
                throttled: bool = True) -> bool:
    """Whether these queues hold ready, throttled or claimed messages, or scheduled ones
    due soon.

    ``--burst`` workers stop when this turns false; retries due within
    ``scheduled_within`` seconds still count as work to wait for. Throttled (rate-limited)
    messages count unless ``throttled`` is False: a worker whose code has no rate-limited
    task can't claim them.
    """
    with connection_for().cursor() as cursor:
        cursor.execute(
            HAS_PENDING_SQL.format(queues=placeholders(len(queues))),
            [*queues, MessageStatus.READY, MessageStatus.CLAIMED,
             MessageStatus.THROTTLED if throttled else MessageStatus.READY,
             MessageStatus.SCHEDULED, micros(scheduled_within)],
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


def claim_groups(cursor: Any) -> list[tuple[str, str, int, int]]:
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
        groups = claim_groups(cursor)
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
                if enqueued_at is None:  # a zero date, changed by hand: age unknown
                    continue
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


def queues_holding(status: str, limit: int = 200) -> list[str]:
    """Names of the queues (of the first ``limit``) that hold a message in ``status``, in
    order: the skip scan of ``queue_names``, then one dive per queue."""
    names = queue_names(limit)
    if not names:
        return []
    with connection_for().cursor() as cursor:
        cursor.execute(" UNION ALL ".join([QUEUE_HOLDS_SQL] * len(names)),
                       [p for name in names for p in (name, name, status)])
        holding = {str(name) for name, holds in cursor.fetchall() if holds}
    return [name for name in names if name in holding]


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


@dataclasses.dataclass(frozen=True)
class WorkerTroubles:
    """A live worker and what keeps failing in it now, one line each."""

    worker_id: str
    lines: list[str]

    def as_json(self) -> dict[str, object]:
        return {"worker": self.worker_id, "troubles": self.lines}


def worker_troubles() -> list[WorkerTroubles]:
    """Live workers whose last heartbeat said something keeps failing in them."""
    with connection_for().cursor() as cursor:
        cursor.execute(WORKER_TROUBLES_SQL, [micros(get_settings().LEASE_SECONDS)])
        return [WorkerTroubles(str(worker), str(text).split("\n"))
                for worker, text in cursor.fetchall()]


@dataclasses.dataclass(frozen=True)
class OldestTransaction:
    """The longest-open InnoDB transaction on the server: purge can't pass its snapshot."""

    connection_id: int
    seconds: int
    #: Empty when this user can't see that connection in the process list.
    user: str = ""
    host: str = ""

    def describe(self) -> str:
        who = f" ({self.user}@{self.host})" if self.user else ""
        return f"connection {self.connection_id}{who}"


@dataclasses.dataclass(frozen=True)
class PurgeLag:
    """How far InnoDB's purge is behind, and the open transaction that holds it back.

    Deleted messages stay in the claim index as delete-marked entries until purge removes
    them, and purge can't remove what an older read snapshot may still see: one long
    transaction anywhere on the server (a ``mysqldump --single-transaction``, a report)
    makes every claim walk past more of them.
    """

    #: None: the server doesn't tell this user (MySQL 8 without PROCESS).
    history_length: int | None
    #: None: no InnoDB transaction is open, or they can't be seen (``visible``).
    oldest: OldestTransaction | None
    #: False: this user lacks the PROCESS privilege, so the oldest transaction is unknown.
    visible: bool

    @property
    def oldest_seconds(self) -> int | None:
        return self.oldest.seconds if self.oldest is not None else None

    def _age_text(self) -> str:
        if not self.visible:
            return "unknown"
        return "none" if self.oldest is None else f"{self.oldest.seconds}s"

    def fields(self) -> str:
        """``history_len=… oldest_trx=…`` for the worker's summary line."""
        length = "unknown" if self.history_length is None else str(self.history_length)
        return f"history_len={length} oldest_trx={self._age_text()}"

    def describe(self) -> str:
        """One line for people: the figures, and whose the oldest transaction is."""
        length = "unknown" if self.history_length is None else f"{self.history_length:,}"
        if not self.visible:
            oldest = "unknown (needs the PROCESS privilege)"
        elif self.oldest is None:
            oldest = "none open"
        else:
            oldest = f"{self.oldest.seconds}s, {self.oldest.describe()}"
        return f"InnoDB history list length {length}; oldest open transaction {oldest}"

    def warning(self, conf: QueueSettings | None = None) -> str | None:
        """What it means and what to do, once a threshold is passed; else None."""
        conf = conf or get_settings()
        over = []
        limit, seconds, oldest = conf.PURGE_LAG_WARNING, conf.PURGE_LAG_WARNING_SECONDS, self.oldest
        if limit and self.history_length is not None and self.history_length > limit:
            over.append(f"InnoDB's history list length is {self.history_length:,} "
                        f"(over MYSQLQ['PURGE_LAG_WARNING'] = {limit:,})")
        if seconds and oldest is not None and oldest.seconds > seconds:
            over.append(f"a transaction has been open for {oldest.seconds}s "
                        f"(over MYSQLQ['PURGE_LAG_WARNING_SECONDS'] = {seconds:g})")
        if not over:
            return None
        return (f"Purge lag: {' and '.join(over)}. InnoDB can't purge deleted rows that an "
                "open read snapshot may still see, so every claim walks past more of them "
                f"and slows down. {self._culprit(seconds)}; run backups (mysqldump "
                "--single-transaction) and reports on a replica, not on the queue's database.")

    def _culprit(self, seconds: float) -> str:
        """Which transaction to end, if one is to blame."""
        oldest = self.oldest
        if oldest is not None and (not seconds or oldest.seconds > seconds):
            return (f"The oldest open transaction is {oldest.describe()}, open for "
                    f"{oldest.seconds}s: end it (KILL {oldest.connection_id} if it is stuck)")
        if not self.visible:
            return ("This database user can't see which transaction holds it back (grant it "
                    "PROCESS, or look in information_schema.INNODB_TRX as an admin): end it")
        youngest_blame = (f"no transaction has been open over {seconds:g}s (the oldest: "
                          f"{oldest.describe()}, {oldest.seconds}s)" if oldest is not None
                          else "no transaction is open now")
        return (f"But {youngest_blame}: purge is catching up after a burst of changes or a "
                "long transaction that just ended (if it stays high, it can't keep up with "
                "the write rate: see innodb_purge_threads)")

    def as_json(self) -> dict[str, object]:
        oldest = self.oldest
        return {
            "history_length": self.history_length,
            "oldest_transaction_seconds": self.oldest_seconds,
            "oldest_transaction": None if oldest is None else {
                "connection_id": oldest.connection_id, "user": oldest.user,
                "host": oldest.host},
            "transactions_visible": self.visible,
        }


def purge_lag(alias: str | None = None) -> PurgeLag:
    """Read the history list length and the oldest open transaction (see ``PurgeLag``).

    Figures this database user may not read come back as unknown, never as an error.
    """
    with connection_for(alias).cursor() as cursor:
        cursor.execute(HISTORY_LENGTH_SQL)
        row = cursor.fetchone()
        length = int(row[1]) if row is not None else _history_metric(cursor)
        try:
            cursor.execute(OLDEST_TRANSACTION_SQL)
        except OperationalError as exc:
            if error_code(exc) not in _NO_PRIVILEGE:
                raise
            return PurgeLag(length, None, visible=False)
        row = cursor.fetchone()
    if row is None:
        return PurgeLag(length, None, visible=True)
    connection_id, seconds, user, host = row
    return PurgeLag(length, OldestTransaction(int(connection_id), max(0, int(seconds)),
                                              str(user), str(host)), visible=True)


def _history_metric(cursor: Any) -> int | None:
    """The history list length from INNODB_METRICS (MySQL 8), or None if it is hidden."""
    try:
        cursor.execute(HISTORY_LENGTH_METRIC_SQL)
    except OperationalError as exc:
        if error_code(exc) in _NO_PRIVILEGE:
            return None
        raise
    row = cursor.fetchone()
    return int(row[0]) if row is not None else None
