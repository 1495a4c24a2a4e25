"""The history table partitioned by primary-key range, so that the archive can drop whole
partitions instead of deleting their rows one by one.

Deleting a history row costs the server about 20 µs of CPU (it is marked and purged in
seven B-trees: docs/performance.md); dropping a partition is a metadata operation, the
same for 10 rows or 10 million. Partitioning is opt-in (``manage.py queuehistory
partition``): converting a big table copies it.

The layout is ``PARTITION BY RANGE (id)``: bounded partitions named after their upper
bound (``p250000`` holds ids below 250,000) and a last one, ``pmax``, for everything
above. Splitting ``pmax`` is cheap only while it is empty, so the command and every
archive keep :data:`KEEP_AHEAD` empty bounded partitions above the highest id.

Every statement that changes the layout, or drops a partition, takes the table's
metadata lock; the session waits for it at most ``lock_wait_timeout`` seconds (short:
while a DDL waits for the lock, every new statement on the table queues behind it, so
workers' acks would stall for as long as it waits).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import time
from collections.abc import Callable
from typing import Any

from django.db import OperationalError

from .base import ATTEMPT_TABLE, connection_for, error_code, logger, naive_utc

#: The partitions of the history table in order (one row with a NULL name: not
#: partitioned). ``TABLE_ROWS`` is InnoDB's estimate.
PARTITIONS_SQL = f"""
SELECT PARTITION_NAME, PARTITION_METHOD, PARTITION_EXPRESSION, PARTITION_DESCRIPTION,
       TABLE_ROWS
  FROM information_schema.PARTITIONS
 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{ATTEMPT_TABLE}'
 ORDER BY PARTITION_ORDINAL_POSITION
"""
#: Foreign keys from or to the history table (InnoDB can't partition a table with any).
FOREIGN_KEYS_SQL = f"""
SELECT CONSTRAINT_NAME FROM information_schema.REFERENTIAL_CONSTRAINTS
 WHERE CONSTRAINT_SCHEMA = DATABASE()
   AND (TABLE_NAME = '{ATTEMPT_TABLE}' OR REFERENCED_TABLE_NAME = '{ATTEMPT_TABLE}')
"""
#: Unique keys without ``id`` (every unique key must hold the partitioning column) and
#: full-text or spatial indexes (partitioned InnoDB tables have none).
BLOCKING_KEYS_SQL = f"""
SELECT INDEX_NAME, MAX(INDEX_TYPE) FROM information_schema.STATISTICS
 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{ATTEMPT_TABLE}'
 GROUP BY INDEX_NAME
HAVING (MIN(NON_UNIQUE) = 0 AND SUM(COLUMN_NAME = 'id') = 0)
    OR MAX(INDEX_TYPE) IN ('FULLTEXT', 'SPATIAL')
"""
#: A Galera node says its cluster's size here (no row, or 0: no cluster).
CLUSTER_SIZE_SQL = "SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'"
#: The lowest and highest id (along the primary key: two index dives).
ID_BOUNDS_SQL = f"SELECT MIN(id), MAX(id) FROM {ATTEMPT_TABLE}"
#: The next id, for an empty table (MySQL caches it unless the session asks fresh).
AUTO_INCREMENT_SQL = f"""
SELECT AUTO_INCREMENT FROM information_schema.TABLES
 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{ATTEMPT_TABLE}'
"""
FRESH_STATS_MYSQL_SQL = "SET SESSION information_schema_stats_expiry = 0"
#: One partition's last finish time and id bounds: each a dive into its own part of an
#: index (``mysqlq_att_finished`` and the primary key; indexes are per partition).
PARTITION_AGE_SQL = (f"SELECT MAX(finished_at), MIN(id), MAX(id) FROM {ATTEMPT_TABLE} "
                     "PARTITION ({partition})")
#: Rows, sum, first and last id of one partition: what the archive compares with the
#: rows it wrote before it drops the partition (a scan of one index of the partition).
PARTITION_TOTALS_SQL = (f"SELECT COUNT(*), COALESCE(SUM(id), 0), MIN(id), MAX(id) "
                        f"FROM {ATTEMPT_TABLE} PARTITION ({{partition}})")
#: Whether a partition holds any row.
PARTITION_ANY_SQL = f"SELECT 1 FROM {ATTEMPT_TABLE} PARTITION ({{partition}}) LIMIT 1"

#: One bounded partition, and the last one, in the statements below.
PARTITION_CLAUSE = "PARTITION {name} VALUES LESS THAN ({bound})"
LAST_PARTITION_CLAUSE = "PARTITION pmax VALUES LESS THAN MAXVALUE"
#: The history indexes the admin's lists walk in order, with their implicit primary-key
#: suffix made explicit. On one table InnoDB stores them the same either way (a
#: secondary index holds the primary key once); on a partitioned table each partition
#: has its own index, and the server merges them in order only on the columns the index
#: names: without ``id`` there, ``ORDER BY finished_at DESC, id DESC`` sorts every
#: match (EXPLAIN: "Using filesort"), with it the list walks the index and stops.
#: (``mysqlq_att_message`` names ``id`` already.) Checked against the model by
#: tests/test_history_partitions.py.
INDEXES_WITH_ID = {
    "mysqlq_att_finished": "finished_at, queue, outcome, task_name, id",
    "mysqlq_att_outcome": "outcome, finished_at, id",
    "mysqlq_att_task": "task_name, finished_at, id",
    "mysqlq_att_queue": "queue, finished_at, id",
}
INDEX_WITH_ID_CLAUSE = "DROP INDEX {name}, ADD INDEX {name} ({columns})"
#: Converts the table (a copy of every row, writes blocked meanwhile), naming ``id`` in
#: the indexes above in the same copy.
PARTITION_TABLE_SQL = (f"ALTER TABLE {ATTEMPT_TABLE} {{indexes}} "
                       "PARTITION BY RANGE (id) ({partitions})")
#: Splits ``pmax`` into new bounded partitions and a new ``pmax`` (instant while it is
#: empty; copies its rows otherwise).
SPLIT_LAST_SQL = f"ALTER TABLE {ATTEMPT_TABLE} REORGANIZE PARTITION pmax INTO ({{partitions}})"
#: Back to one table (a copy of every row).
UNPARTITION_SQL = f"ALTER TABLE {ATTEMPT_TABLE} REMOVE PARTITIONING"
DROP_PARTITION_SQL = f"ALTER TABLE {ATTEMPT_TABLE} DROP PARTITION {{partition}}"
#: Held around the last check and the drop: no row can arrive between them, and the
#: lock is granted only once every open transaction that touched the table has ended
#: (so a row inserted by a transaction that commits late is counted, not dropped).
LOCK_SQL = f"LOCK TABLES {ATTEMPT_TABLE} WRITE"
UNLOCK_SQL = "UNLOCK TABLES"
LOCK_WAIT_SQL = "SET SESSION lock_wait_timeout = %s"
LOCK_WAIT_DEFAULT_SQL = "SET SESSION lock_wait_timeout = DEFAULT"

LAST = "pmax"
#: Empty bounded partitions kept above the highest id.
KEEP_AHEAD = 2
#: Seconds a DDL of the archive waits for the table's metadata lock, per try.
LOCK_WAIT_SECONDS = 1
#: Tries of a drop (a pause between them) before the archive deletes the rows instead.
DROP_TRIES = 3
DROP_PAUSE = 2.0
LOCK_WAIT_TIMEOUT = 1205
UNKNOWN_VARIABLE = 1193
_NAME = re.compile(r"^(p[0-9]{1,20}|pmax)$")

Progress = Callable[[str], None]


class PartitionError(Exception):
    """The history table can't be (un)partitioned, or is partitioned some other way."""


@dataclasses.dataclass(frozen=True)
class Partition:
    name: str
    #: Ids from ``low`` (the previous partition's bound; 0 for the first) …
    low: int
    #: … up to, not including, ``high`` (None: ``pmax``, no upper bound).
    high: int | None
    #: InnoDB's estimate of its rows.
    rows_estimate: int


def _name(partition: str) -> str:
    if not _NAME.match(partition):
        raise PartitionError(f"Not a partition this app made: {partition!r}.")
    return partition


def _rows(sql: str, params: list[Any] | None = None, alias: str | None = None
          ) -> list[tuple[Any, ...]]:
    with connection_for(alias).cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


def layout(alias: str | None = None) -> list[Partition] | None:
    """The history table's partitions in order, or None if it is not partitioned.

    Raises :class:`PartitionError` if it is partitioned other than by range of ``id``
    into partitions this app names (it then leaves the table alone).
    """
    rows = _rows(PARTITIONS_SQL, alias=alias)
    if not rows or rows[0][0] is None:
        return None
    found, low = [], 0
    for name, method, expression, description, estimate in rows:
        if method != "RANGE" or str(expression).strip("` ") != "id" or not _NAME.match(name):
            raise PartitionError(
                f"{ATTEMPT_TABLE} is partitioned by {method} ({expression}) with a partition "
                f"{name!r}: not the layout this app manages (RANGE (id)); leaving it alone.")
        high = None if str(description).upper() == "MAXVALUE" else int(description)
        found.append(Partition(str(name), low, high, int(estimate or 0)))
        low = high if high is not None else low
    if found[-1].name != LAST:
        raise PartitionError(f"{ATTEMPT_TABLE} has no {LAST} partition (VALUES LESS THAN "
                             "MAXVALUE): not the layout this app manages; leaving it alone.")
    return found


def check_partitionable(alias: str | None = None) -> None:
    """Raise :class:`PartitionError` unless InnoDB can partition the table by ``id``
    (and the server is no Galera node: the archive's drop needs ``LOCK TABLES``, which
    Galera does not support, and a DDL there stops the whole cluster's writes)."""
    size = _rows(CLUSTER_SIZE_SQL, alias=alias)
    if size and str(size[0][1]).isdigit() and int(size[0][1]) > 0:
        raise PartitionError("The queue database is a node of a Galera cluster: the history "
                             "table is not partitioned there (the archive's drop needs LOCK "
                             "TABLES, which Galera does not support).")
    keys = _rows(FOREIGN_KEYS_SQL, alias=alias)
    if keys:
        raise PartitionError(
            f"{ATTEMPT_TABLE} has foreign keys ({', '.join(str(k[0]) for k in keys)}); "
            "InnoDB can't partition a table with foreign keys from or to it. Drop them first.")
    blocking = _rows(BLOCKING_KEYS_SQL, alias=alias)
    if blocking:
        raise PartitionError(
            f"{ATTEMPT_TABLE} has indexes a table partitioned by id can't have: "
            f"{', '.join(f'{name} ({kind})' for name, kind in blocking)}. Every unique key "
            "must include id, and full-text or spatial indexes are not allowed.")


def id_bounds(alias: str | None = None) -> tuple[int, int] | None:
    low, high = _rows(ID_BOUNDS_SQL, alias=alias)[0]
    return None if low is None else (int(low), int(high))


def _next_id(alias: str | None) -> int:
    """The id the next row gets (at least)."""
    bounds = id_bounds(alias)
    if bounds is not None:
        return bounds[1] + 1
    connection = connection_for(alias)
    if not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        try:
            _rows(FRESH_STATS_MYSQL_SQL, alias=alias)
        except OperationalError as exc:
            if error_code(exc) != UNKNOWN_VARIABLE:
                raise  # (MariaDB spoken to as MySQL has no such variable: fresh already)
    value = _rows(AUTO_INCREMENT_SQL, alias=alias)[0][0]
    return int(value or 1)


def _clauses(bounds: list[int]) -> str:
    return ", ".join([*(PARTITION_CLAUSE.format(name=f"p{bound}", bound=bound)
                        for bound in bounds), LAST_PARTITION_CLAUSE])


def plan_bounds(low: int, next_id: int, width: int, ahead: int = KEEP_AHEAD,
                have: int = 0) -> list[int]:
    """Upper bounds of new partitions of ``width`` ids from ``low`` on, until ``ahead``
    partitions (``have`` of them already there) lie wholly at or above ``next_id``."""
    bounds = []
    while have < ahead:
        bounds.append(low + width)
        have += low >= next_id
        low += width
    return bounds


def _ddl(sql: str, alias: str | None, lock_wait: int | None) -> None:
    with connection_for(alias).cursor() as cursor:
        if lock_wait is not None:
            cursor.execute(LOCK_WAIT_SQL, [lock_wait])
        try:
            cursor.execute(sql)
        finally:
            if lock_wait is not None:
                cursor.execute(LOCK_WAIT_DEFAULT_SQL)


@dataclasses.dataclass
class Change:
    """What a layout change did."""

    #: Partitions made.
    added: list[str] = dataclasses.field(default_factory=list)
    #: Rows copied (a conversion, or rows that had reached ``pmax``).
    copied: int = 0
    #: Why nothing was done, when nothing was.
    skipped: str = ""


def partition(width: int, *, ahead: int = KEEP_AHEAD, alias: str | None = None,
              progress: Progress | None = None) -> Change:
    """Partition the history table by ranges of ``width`` ids (a copy of the table), or,
    if it is already, add partitions so that ``ahead`` empty ones lie above its rows
    (splitting ``pmax`` copies whatever rows reached it)."""
    if width < 1 or ahead < 1:
        raise PartitionError("--rows-per-partition and --ahead must be at least 1.")
    current = layout(alias)
    if current is not None:
        return keep_ahead(alias, width=width, ahead=ahead, copy=True, progress=progress)
    check_partitionable(alias)
    bounds_now = id_bounds(alias)
    next_id = _next_id(alias)
    first = bounds_now[0] if bounds_now is not None else next_id
    bounds = plan_bounds(first // width * width, next_id, width, ahead)
    rows = 0 if bounds_now is None else bounds_now[1] - bounds_now[0] + 1
    if progress is not None:
        progress(f"partitioning {ATTEMPT_TABLE} into {len(bounds) + 1} partitions of "
                 f"{width} ids (copies the table: ids {bounds_now or 'none'}; writes to it "
                 "wait until it is done)")
    indexes = ", ".join(INDEX_WITH_ID_CLAUSE.format(name=name, columns=columns)
                        for name, columns in INDEXES_WITH_ID.items())
    _ddl(PARTITION_TABLE_SQL.format(indexes=indexes, partitions=_clauses(bounds)), alias,
         None)
    return Change(added=[*(f"p{b}" for b in bounds), LAST], copied=rows)


def keep_ahead(alias: str | None = None, *, width: int | None = None,
               ahead: int = KEEP_AHEAD, copy: bool = False,
               lock_wait: int | None = LOCK_WAIT_SECONDS,
               progress: Progress | None = None) -> Change:
    """Split ``pmax`` so that at least ``ahead`` empty bounded partitions lie above the
    highest id. ``width``: ids per new partition (default: the last bounded one's).

    With rows already in ``pmax`` the split copies them (and blocks writes meanwhile):
    only with ``copy`` (the command); the archive leaves it and says so.
    """
    current = layout(alias)
    if current is None:
        return Change(skipped="not partitioned")
    next_id = _next_id(alias)
    bounded = [p for p in current if p.high is not None]
    have = sum(1 for p in bounded if p.low >= next_id)
    if have >= ahead:
        return Change(skipped="enough partitions ahead")
    if width is None:
        width = (bounded[-1].high - bounded[-1].low) if bounded else 0  # type: ignore[operator]
        if width < 1:
            return Change(skipped="no bounded partition to take the width from")
    last = current[-1]
    in_last = bool(_rows(PARTITION_ANY_SQL.format(partition=LAST), alias=alias))
    if in_last and not copy:
        message = (f"rows have reached {ATTEMPT_TABLE}'s {LAST} partition: splitting it "
                   "copies them and blocks writes meanwhile, so the archive leaves it; "
                   "run manage.py queuehistory partition to add partitions")
        logger.warning(message)
        if progress is not None:
            progress(message)
        return Change(skipped=message)
    start = last.low if bounded else next_id // width * width
    bounds = plan_bounds(start, next_id, width, ahead, have)
    copied = 0
    if in_last:
        stop = id_bounds(alias)
        copied = 0 if stop is None else max(0, stop[1] - last.low + 1)
        message = (f"splitting {LAST}, which holds rows (ids from {last.low}): they are "
                   "copied, and writes to the table wait meanwhile")
        logger.warning(message)
        if progress is not None:
            progress(message)
    _ddl(SPLIT_LAST_SQL.format(partitions=_clauses(bounds)), alias,
         None if copy else lock_wait)
    return Change(added=[f"p{b}" for b in bounds], copied=copied)


def unpartition(alias: str | None = None) -> bool:
    """Back to one table (a copy of the table); False if it was not partitioned. Undoes
    any partitioning, this app's or not."""
    rows = _rows(PARTITIONS_SQL, alias=alias)
    if not rows or rows[0][0] is None:
        return False
    _ddl(UNPARTITION_SQL, alias, None)
    return True


@dataclasses.dataclass(frozen=True)
class Droppable:
    """A partition whose rows all finished before a cut-off, below the highest id."""

    partition: Partition
    #: Its first and last id (None: empty).
    first: int | None
    last: int | None


def old_partitions(before: dt.datetime, alias: str | None = None) -> list[Droppable]:
    """Bounded partitions wholly below the highest id (no new row can get an id in them)
    whose rows all finished before ``before``, in order; empty ones too."""
    current = layout(alias)
    bounds = id_bounds(alias)
    if current is None or bounds is None:
        return []
    found = []
    for part in current:
        if part.high is None or part.high > bounds[1]:
            break
        finished, first, last = _rows(PARTITION_AGE_SQL.format(partition=_name(part.name)),
                                      alias=alias)[0]
        if finished is None or finished < naive_utc(before):
            found.append(Droppable(part, None if first is None else int(first),
                                   None if last is None else int(last)))
    return found


Totals = tuple[int, int, int | None, int | None]


def totals(name: str, alias: str | None = None) -> Totals:
    """``(rows, sum of ids, first id, last id)`` of one partition."""
    count, total, first, last = _rows(PARTITION_TOTALS_SQL.format(partition=_name(name)),
                                      alias=alias)[0]
    return (int(count), int(total), None if first is None else int(first),
            None if last is None else int(last))


#: Seconds this process held the history table's lock for drops (summed; the archive
#: reports it).
held = {"seconds": 0.0}


def _drop_once(name: str, high: int, expected: Totals, alias: str | None,
               lock_wait: int) -> str:
    """One try; returns what happened: ``dropped``, ``locked``, ``gone`` or ``changed``."""
    connection = connection_for(alias)
    with connection.cursor() as cursor:
        cursor.execute(LOCK_WAIT_SQL, [lock_wait])
        try:
            try:
                cursor.execute(LOCK_SQL)
            except OperationalError as exc:
                if error_code(exc) == LOCK_WAIT_TIMEOUT:
                    return "locked"
                raise
            locked = time.monotonic()
            try:
                now = {p.name: p for p in layout(alias) or []}
                if name not in now or now[name].high != high:
                    return "gone"
                if totals(name, alias) != tuple(expected):
                    return "changed"
                cursor.execute(DROP_PARTITION_SQL.format(partition=_name(name)))
                return "dropped"
            finally:
                cursor.execute(UNLOCK_SQL)
                seconds = time.monotonic() - locked
                held["seconds"] += seconds
                logger.info("Partition %s of %s: checked under the table's lock, held %.3f s",
                            name, ATTEMPT_TABLE, seconds)
        finally:
            cursor.execute(LOCK_WAIT_DEFAULT_SQL)


def drop_archived(name: str, high: int, expected: Totals, alias: str | None = None, *,
                  lock_wait: int = LOCK_WAIT_SECONDS, tries: int = DROP_TRIES,
                  pause: float = DROP_PAUSE) -> str:
    """Drop partition ``name`` (upper bound ``high``) if it still holds exactly the rows
    ``expected`` describes (checked under a table lock, just before the drop).

    Returns ``dropped``; ``gone`` (no such partition: dropped before, e.g. by a run
    killed right after); ``changed`` (it holds other rows); or ``locked`` (the table's
    lock was not granted within ``lock_wait`` seconds, ``tries`` times). The caller
    deletes the archived rows one by one unless it was ``dropped``.
    """
    outcome = "locked"
    for attempt in range(tries):
        outcome = _drop_once(name, high, expected, alias, lock_wait)
        if outcome != "locked":
            return outcome
        if attempt < tries - 1:
            time.sleep(pause)
    logger.warning("The archive could not lock %s for %d s (%d tries) to drop partition %s: "
                   "a long transaction holds the table; deleting its rows instead.",
                   ATTEMPT_TABLE, lock_wait, tries, name)
    return outcome


def drop_empty(before: dt.datetime, alias: str | None = None,
               lock_wait: int = LOCK_WAIT_SECONDS) -> list[str]:
    """Drop the empty bounded partitions below the highest id (left by row deletes, or a
    purge); returns their names. One try: a busy table leaves them for next time."""
    dropped = []
    for old in old_partitions(before, alias):
        if old.first is None and old.partition.high is not None:
            outcome = _drop_once(old.partition.name, old.partition.high, (0, 0, None, None),
                                 alias, lock_wait)
            if outcome == "locked":
                break  # one wait for the lock is enough: the next run tries again
            if outcome == "dropped":
                dropped.append(old.partition.name)
    return dropped
