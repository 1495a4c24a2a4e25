"""The archive's statements: one run at a time, the source's side of the check, exact deletes.

An archive copies rows to Parquet, compares what it wrote with what the source holds
(:func:`history_partition_stats` per day and queue), then deletes exactly the ids it
wrote (:func:`delete_history`), a short autocommit ``DELETE … WHERE id IN (…)`` at a
time, like retention's batches: no long transaction, no lock held for more than one
statement, and a row that was never written can't be deleted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .base import (
    ATTEMPT_TABLE,
    MESSAGE_TABLE,
    connection_for,
    default_alias,
    in_transaction,
    naive_utc,
    placeholders,
    require_autocommit,
    schema_lock_name,
    with_lock_retry,
)

#: One archive run per database at a time (held by the driver's connection: a killed
#: driver's connection closes, and with it the lock).
ARCHIVE_LOCK_SQL = f"SELECT GET_LOCK({schema_lock_name('mysqlq_archive:')}, 0)"
ARCHIVE_UNLOCK_SQL = f"SELECT RELEASE_LOCK({schema_lock_name('mysqlq_archive:')})"

#: What the source holds of one archive batch, per day and queue: rows, and sum, first
#: and last of their ids. Along the primary key over the batch's id range.
#: Read from mysqlq_att_finished alone (it holds finished_at, queue and the primary key),
#: over the finish times the written files span: a fraction of the table's bytes. A
#: source row outside that span is not counted here, and is not deleted either (the
#: delete takes the files' ids): it stays in MySQL for the next run.
HISTORY_STATS_SQL = f"""
SELECT DATE(finished_at) AS day, queue, COUNT(*), SUM(id), MIN(id), MAX(id)
  FROM {ATTEMPT_TABLE} FORCE INDEX (mysqlq_att_finished)
 WHERE finished_at >= %s AND finished_at <= %s AND finished_at < %s
   AND id >= %s AND id < %s
 GROUP BY day, queue
"""
DEAD_STATS_SQL = f"""
SELECT DATE(run_at) AS day, queue, COUNT(*), SUM(id), MIN(id), MAX(id)
  FROM {MESSAGE_TABLE} FORCE INDEX (PRIMARY)
 WHERE id >= %s AND id < %s AND status = 'dead' AND run_at < %s AND gate_key IS NULL
 GROUP BY day, queue
"""
#: Exactly the archived history rows of one delete batch.
DELETE_HISTORY_SQL = f"DELETE FROM {ATTEMPT_TABLE} WHERE id IN ({{ids}})"
#: The same as a range of the primary key (MariaDB): faster than a list of ids, and the
#: ids it returns are compared with the archived ones before the transaction commits.
DELETE_HISTORY_RANGE_SQL = f"""
DELETE FROM {ATTEMPT_TABLE} WHERE id >= %s AND id <= %s AND finished_at < %s RETURNING id
"""
#: Exactly the archived dead messages, if they are still dead and still as old: one an
#: operator requeued since stays (and is archived again if it dies again).
DELETE_DEAD_SQL = f"""
DELETE FROM {MESSAGE_TABLE} WHERE id IN ({{ids}}) AND status = 'dead' AND run_at < %s
   AND gate_key IS NULL
"""

#: ``{(day "YYYY-MM-DD", queue): (rows, sum of ids, first id, last id)}``
PartitionStats = dict[tuple[str, str], tuple[int, int, int, int]]


def take_archive_lock(alias: str | None = None) -> bool:
    """Whether this connection now holds the archive lock (False: another run has it)."""
    with connection_for(alias).cursor() as cursor:
        cursor.execute(ARCHIVE_LOCK_SQL)
        return bool(cursor.fetchone()[0])


def release_archive_lock(alias: str | None = None) -> None:
    with connection_for(alias).cursor() as cursor:
        cursor.execute(ARCHIVE_UNLOCK_SQL)


def _stats(sql: str, params: list[Any], alias: str | None) -> PartitionStats:
    with connection_for(alias).cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return {(day.isoformat(), str(queue)): (int(count), int(total), int(first), int(last))
            for day, queue, count, total, first, last in rows}


def history_partition_stats(low: int, high: int, before: dt.datetime,
                            span: tuple[dt.datetime, dt.datetime],
                            alias: str | None = None) -> PartitionStats:
    """Per day and queue, the history rows with ``low <= id < high`` finished before
    ``before`` and within ``span`` (first and last finish of the rows written): what an
    archive batch over that range must have written."""
    return _stats(HISTORY_STATS_SQL, [naive_utc(span[0]), naive_utc(span[1]),
                                      naive_utc(before), low, high], alias)


def dead_partition_stats(low: int, high: int, before: dt.datetime,
                         alias: str | None = None) -> PartitionStats:
    """The same for dead messages that died before ``before``."""
    return _stats(DEAD_STATS_SQL, [low, high, naive_utc(before)], alias)


def _delete(sql: str, ids: Sequence[int], extra: list[Any], alias: str | None) -> int:
    alias = alias or default_alias()
    require_autocommit(alias, "An archive's delete")

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(sql.format(ids=placeholders(len(ids))), [*ids, *extra])
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)


def delete_history(ids: Sequence[int], alias: str | None = None,
                   before: dt.datetime | None = None) -> int:
    """Delete exactly these history rows; return how many went.

    On MariaDB, with ``before`` (the archive's cut-off), as one range of the primary key
    in a short transaction that commits only if the ids deleted are these ids (else it
    rolls back and deletes the list); elsewhere one autocommit ``DELETE … IN (…)``.
    """
    if not ids:
        return 0
    ids = sorted(int(i) for i in ids)
    alias = alias or default_alias()
    if before is not None and connection_for(alias).mysql_is_mariadb:  # type: ignore[attr-defined]
        wanted = set(ids)

        def body(cursor: Any) -> int:
            cursor.execute(DELETE_HISTORY_RANGE_SQL, [ids[0], ids[-1], naive_utc(before)])
            if {int(row[0]) for row in cursor.fetchall()} <= wanted:
                return int(cursor.rowcount)
            raise _NotOnlyThese

        require_autocommit(alias, "An archive's delete")
        try:
            return in_transaction(alias, body)
        except _NotOnlyThese:
            pass  # a row in the range was not archived (committed late): delete the list
    return _delete(DELETE_HISTORY_SQL, ids, [], alias)


class _NotOnlyThese(Exception):
    """A range delete touched a row that is not in the archive: it is rolled back."""


def delete_dead(ids: Sequence[int], before: dt.datetime, alias: str | None = None) -> int:
    """Delete these messages if still dead since before ``before``; return how many went."""
    if not ids:
        return 0
    return _delete(DELETE_DEAD_SQL, [int(i) for i in ids], [naive_utc(before)], alias)
