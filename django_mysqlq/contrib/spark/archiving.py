"""``archive``: move history (and dead messages, topic messages) older than a cut-off to
Parquet, exactly once.

Rows go in batches of ``batch_rows`` ids (see :mod:`.batches` for one batch's steps and
why a kill at any of them loses or doubles nothing). While Spark stages and verifies
the next batch, a thread of the driver deletes the previous one, so the database's
deletes and Spark's reads overlap. One run at a time per database (a named lock on the
driver's connection, released when the driver dies).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import OperationalError, connections
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ...broker import archive as statements
from ...broker import database_now, partitions, topic_retention
from ...broker import pipeline as reads
from . import batches
from .batches import Batch, BatchMismatch, Control, Recovered
from .database import Database, database
from .errors import PipelineError
from .layout import DEAD, HISTORY, SCHEMAS, TOPICS
from .reading import micros_to_timestamp, plan, read

#: Ids per batch: small enough that deleting one batch overlaps writing the next most of
#: the time (only the last batch's delete runs alone), big enough that a batch's fixed
#: Spark jobs (write, read back, ids) stay a small part of it.
DEFAULT_BATCH_ROWS = 200_000
DEFAULT_DELETE_BATCH = 2_000
#: Seconds between the driver's checks that the deleter still takes work, while it waits
#: to hand a batch over.
HANDOVER_POLL = 0.5
#: Times a batch is staged again when the source changed under it.
BATCH_TRIES = 3
#: What ``sources`` may name.
SOURCES = (HISTORY, TOPICS)

Progress = Callable[[str], None]


@dataclasses.dataclass
class ArchiveResult:
    cutoff: dt.datetime
    dry_run: bool
    #: Rows that would move (dry run) or moved, per kind.
    rows: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Rows deleted from MySQL, per kind (dead messages an operator revived meanwhile stay).
    deleted: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Batches this run committed.
    committed: list[str] = dataclasses.field(default_factory=list)
    recovered: Recovered = dataclasses.field(default_factory=Recovered)
    #: For a dry run: batches an interrupted run left (committed, staged).
    pending: tuple[list[str], list[str]] = ([], [])
    seconds: float = 0.0
    #: Seconds per step, summed over batches (``delete`` runs beside the next batch).
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    #: A partitioned history table: the partitions dropped whole (a dry run: that would
    #: be), and those whose drop gave way to row deletes, with why (``locked``: the
    #: table's lock was not granted in time; ``changed``: it held other rows).
    dropped: list[str] = dataclasses.field(default_factory=list)
    not_dropped: dict[str, str] = dataclasses.field(default_factory=dict)
    #: A dry run on a partitioned table: history rows that would go with dropped
    #: partitions (the rest of ``rows``, deleted row by row).
    rows_in_dropped: int = 0
    #: Partitions added above the highest id, and empty old ones dropped.
    partitions_added: list[str] = dataclasses.field(default_factory=list)


def _frame(spark: SparkSession, db: Database, batch: Batch, partition_rows: int | None,
           max_connections: int | None) -> DataFrame:
    key = "id"
    if batch.kind == TOPICS:
        assert batch.topic is not None
        table = reads.topic_select(batch.topic)
        times = {"published_us": "published_at", "sequenced_us": "sequenced_at"}
        day = "published_at"
        key = "msg_offset"
    elif batch.kind == HISTORY:
        where = f"{reads.older_where(batch.cutoff)}"
        table = reads.HISTORY_SELECT.format(columns=reads.HISTORY_COLUMNS, where=where)
        times = {"enqueued_us": "enqueued_at", "started_us": "started_at",
                 "finished_us": "finished_at"}
        day = "finished_at"
    else:
        table = reads.DEAD_SELECT.format(columns=reads.DEAD_COLUMNS,
                                         where=reads.dead_where(batch.cutoff))
        times = {"enqueued_us": "enqueued_at", "died_us": "died_at"}
        day = "died_at"
    frame = read(spark, db, table, plan(batch.low, batch.high - 1, partition_rows,
                                        max_connections), key=key)
    frame = micros_to_timestamp(frame, times).withColumn("day", F.to_date(F.col(day)))
    if batch.kind == TOPICS:
        frame = frame.withColumnRenamed("msg_offset", "offset").withColumnRenamed(
            "msg_key", "key")
    schema = SCHEMAS[batch.kind]
    return frame.select(*[F.col(field.name).cast(field.dataType).alias(field.name)
                          for field in schema.fields])


class Deleter(threading.Thread):
    """Deletes committed batches one after another, beside Spark's next batch."""

    def __init__(self, control: Control, alias: str, delete_batch: int,
                 progress: Progress | None) -> None:
        super().__init__(name="mysqlq-archive-deleter", daemon=True)
        self.control, self.alias, self.delete_batch = control, alias, delete_batch
        self.progress = progress
        self.work: queue.Queue[tuple[dict[str, Any], list[int], bool] | None] = queue.Queue(1)
        self.deleted: dict[str, int] = {}
        self.lock = threading.Lock()
        self.seconds = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while (item := self.work.get()) is not None:
                record, ids, try_drop = item
                started = time.monotonic()
                done = batches.delete(self.control, record, ids, self.alias,
                                      self.delete_batch, try_drop=try_drop)
                self.add(record["kind"], done)
                self.seconds += time.monotonic() - started
                if self.progress is not None:
                    self.progress(f"batch {record['batch']}: deleted {done} of "
                                  f"{len(ids)} rows")
        except BaseException as exc:  # noqa: BLE001  (reported by finish(); the batch stays committed)
            self.error = exc
        finally:
            connections[self.alias].close()

    def add(self, kind: str, rows: int) -> None:
        """Count rows gone (deleted here, or dropped with a partition by the driver)."""
        with self.lock:
            self.deleted[kind] = self.deleted.get(kind, 0) + rows

    def submit(self, record: dict[str, Any], ids: list[int], try_drop: bool = True) -> None:
        self._check()
        if not self._hand_over((record, ids, try_drop)):
            self._check()
            raise PipelineError("The archive's deleter thread stopped; the batches are "
                                "committed: run archive again to finish them.")

    def finish(self) -> dict[str, int]:
        self.stop()
        self._check()
        return self.deleted

    def stop(self) -> None:
        """End the thread: after its queued work, or at once if it already stopped."""
        self._hand_over(None)
        self.join()

    def _hand_over(self, item: tuple[dict[str, Any], list[int], bool] | None) -> bool:
        """Queue ``item`` unless the thread stopped (a failed delete ends it with the next
        batch still queued: a plain ``put`` would wait forever, holding the archive's
        lock). The batch it would not take stays committed, for the next run."""
        while self.is_alive():
            try:
                self.work.put(item, timeout=HANDOVER_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _check(self) -> None:
        if self.error is not None:
            raise PipelineError(f"Deleting archived rows failed ({self.error}); the batch "
                                "is committed: run archive again to finish it.") from self.error


def _ranges(low: int, high: int, batch_rows: int) -> list[tuple[int, int]]:
    return [(start, min(start + batch_rows, high + 1))
            for start in range(low, high + 1, batch_rows)]


class Timer:
    """Seconds per step, summed."""

    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings
        self.mark = time.monotonic()

    def step(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = self.timings.get(name, 0.0) + now - self.mark
        self.mark = now


def _archive_batch(spark: SparkSession, control: Control, db: Database, batch: Batch,
                   deleter: Deleter, partition_rows: int | None,
                   max_connections: int | None, timer: Timer) -> int:
    for attempt in range(BATCH_TRIES):
        staged = batches.stage(control, batch,
                               _frame(spark, db, batch, partition_rows, max_connections))
        timer.step("stage")
        if not staged:
            control.store.delete(control.staging(batch.name))
            return 0
        try:
            written = batches.verify(control, batch, db.alias)
        except BatchMismatch:
            control.store.delete(control.staging(batch.name))
            if attempt == BATCH_TRIES - 1:
                raise
            continue
        finally:
            timer.step("verify")
        drop = batches.drop_plan(batch, written, db.alias)
        if batch.partition is not None and drop is None:
            control.drops[batch.partition[0]] = "changed"
        record = batches.commit(control, batch, written.stats, drop)
        batches.move(control, record)
        timer.step("commit and move")
        if record.get("drop") is not None:
            # Here, between Spark's jobs: a read of the next batch would hold the table's
            # metadata lock for seconds, and the drop (and the acks behind it) wait for it.
            dropped = batches.drop(control, record, db.alias)
            timer.step("drop partitions")
            if dropped is not None:
                deleter.add(batch.kind, dropped)
                return int(record["rows"])
        deleter.submit(record, written.ids, try_drop=False)
        timer.step("wait for the previous batch's delete")
        return int(record["rows"])
    raise AssertionError("unreachable")


def _plans(kind: str, cutoff: dt.datetime, alias: str, batch_rows: int,
           stamp: str) -> list[Batch]:
    """The batches of one kind: id ranges (history, dead), or for topics the offset
    ranges of each topic's archivable prefix."""
    if kind == TOPICS:
        found = []
        for topic in topic_retention.topic_names(alias):
            bounds = topic_retention.archivable_offsets(topic, cutoff, alias)
            if bounds is None:
                continue
            tag = hashlib.sha1(topic.encode()).hexdigest()[:12]
            found += [Batch(TOPICS, low, high, cutoff,
                            f"{TOPICS}-{tag}-{low:012d}-{high:012d}-{stamp}", topic)
                      for low, high in _ranges(bounds[0], bounds[1], batch_rows)]
        return found
    bounds = (reads.older_bounds(cutoff, alias) if kind == HISTORY
              else reads.dead_bounds(cutoff, alias))
    if bounds is None:
        return []
    whole = [] if kind != HISTORY else [
        old for old in partitions.old_partitions(cutoff, alias) if old.first is not None]
    found = [Batch(kind, old.first, old.last + 1, cutoff,  # type: ignore[arg-type,operator]
                   f"{kind}-{old.first:012d}-{old.last + 1:012d}-{stamp}",  # type: ignore[operator]
                   partition=(old.partition.name, old.partition.high))  # type: ignore[arg-type]
             for old in whole]
    for start, stop in _gaps(bounds[0], bounds[1] + 1,
                             [(old.partition.low, old.partition.high) for old in whole]):
        found += [Batch(kind, low, high, cutoff, f"{kind}-{low:012d}-{high:012d}-{stamp}")
                  for low, high in _ranges(start, stop - 1, batch_rows)]
    return sorted(found, key=lambda batch: batch.low)


def _gaps(low: int, high: int, taken: list[tuple[int, int | None]]) -> list[tuple[int, int]]:
    """The parts of ``[low, high)`` outside every ``[start, stop)`` of ``taken`` (sorted)."""
    found = []
    for start, stop in taken:
        if start > low:
            found.append((low, min(start, high)))
        low = max(low, stop if stop is not None else high)
    if low < high:
        found.append((low, high))
    return [(a, b) for a, b in found if a < b]


def _dry_drops(cutoff: dt.datetime, alias: str, result: ArchiveResult) -> None:
    """Which partitions a run would drop, and the rows they hold."""
    for old in partitions.old_partitions(cutoff, alias):
        if old.first is not None:
            result.dropped.append(old.partition.name)
            result.rows_in_dropped += partitions.totals(old.partition.name, alias)[0]


def _dry_counts(kinds: list[str], cutoff: dt.datetime, alias: str) -> dict[str, int]:
    counts = {}
    for kind in kinds:
        if kind in (HISTORY, DEAD):
            bounds = (reads.older_bounds(cutoff, alias) if kind == HISTORY
                      else reads.dead_bounds(cutoff, alias))
            counts[kind] = 0 if bounds is None else bounds[2]
        else:
            counts[kind] = sum(
                bounds[2] for topic in topic_retention.topic_names(alias)
                if (bounds := topic_retention.archivable_offsets(topic, cutoff, alias,
                                                                 repair=False)))
    return counts


def _tend(alias: str, cutoff: dt.datetime, result: ArchiveResult,
          progress: Progress | None) -> None:
    """A partitioned history table: drop its empty old partitions, and keep empty ones
    ahead of its ids (a busy table, or rows in ``pmax``, leave that for the next run)."""
    try:
        if partitions.layout(alias) is None:
            return
        result.partitions_added += partitions.keep_ahead(alias, progress=progress).added
        gone = partitions.drop_empty(cutoff, alias)
    except OperationalError as exc:
        if exc.args[:1] != (partitions.LOCK_WAIT_TIMEOUT,):
            raise
        if progress is not None:
            progress("the history table was busy (its lock not granted within "
                     f"{partitions.LOCK_WAIT_SECONDS} s): partitions left as they are")
        return
    if progress is not None and (gone or result.partitions_added):
        progress(f"partitions: added {', '.join(result.partitions_added) or 'none'}; "
                 f"dropped empty {', '.join(gone) or 'none'}")


def archive(spark: SparkSession, to: str, older_than: dt.timedelta, *,
            include_dead: bool = False, sources: tuple[str, ...] | list[str] = (HISTORY,),
            dry_run: bool = False,
            database_alias: str | None = None, batch_rows: int = DEFAULT_BATCH_ROWS,
            delete_batch: int = DEFAULT_DELETE_BATCH, partition_rows: int | None = None,
            max_connections: int | None = None,
            progress: Progress | None = None) -> ArchiveResult:
    """Move history finished before now - ``older_than`` (and, with ``include_dead``,
    messages dead since before then) to Parquet under ``to``, then delete them.

    ``sources`` names what to archive: ``history`` (and with it, ``include_dead``, dead
    messages) and/or ``topics``: topic messages published before the cut-off and passed
    by every consumer group of their topic, the prefix topic retention would delete.

    First finishes what an interrupted run left. ``dry_run`` counts, changes nothing.
    """
    started = time.monotonic()
    if older_than < dt.timedelta(0):
        raise PipelineError(f"--older-than must not be negative, not {older_than}.")
    if batch_rows < 1 or delete_batch < 1:
        raise PipelineError("--batch-rows and --delete-batch must be at least 1.")
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown or not sources:
        raise PipelineError(f"--source takes {' and/or '.join(SOURCES)}, not "
                            f"{','.join(unknown) or 'nothing'}.")
    if include_dead and HISTORY not in sources:
        raise PipelineError("--include-dead goes with --source history.")
    db = database(database_alias)
    cutoff = database_now() - older_than
    control = Control(spark, to)
    kinds = [kind for kind in (HISTORY, DEAD, TOPICS)
             if kind in sources or (kind == DEAD and include_dead)]
    if dry_run:
        dry = ArchiveResult(cutoff=cutoff, dry_run=True,
                            rows=_dry_counts(kinds, cutoff, db.alias),
                            pending=batches.pending(control))
        if HISTORY in kinds:
            _dry_drops(cutoff, db.alias, dry)
        return dry
    if connections[db.alias].in_atomic_block:
        raise PipelineError("archive() deletes in autocommit batches: call it outside "
                            "transaction.atomic().")
    if not statements.take_archive_lock(db.alias):
        raise PipelineError("Another archive is running on this database; wait for it to "
                            "finish (or for its driver to die) and run this one again.")
    result = ArchiveResult(cutoff=cutoff, dry_run=False)
    held_before = partitions.held["seconds"]
    deleter = Deleter(control, db.alias, delete_batch, progress)
    try:
        timer = Timer(result.timings)
        control.claim_database(db.identity)
        result.recovered = batches.recover(control, db.alias, delete_batch)
        timer.step("recover")
        if progress is not None and (result.recovered.finished or result.recovered.dropped):
            progress(f"finished {len(result.recovered.finished)} batch(es) an interrupted "
                     f"run committed ({result.recovered.deleted} rows deleted); dropped "
                     f"{len(result.recovered.dropped)} it had not committed")
        _tend(db.alias, cutoff, result, progress)
        timer.step("partitions")
        deleter.start()
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        for kind in kinds:
            planned = _plans(kind, cutoff, db.alias, batch_rows, stamp)
            timer.step("plan")
            result.rows[kind] = 0
            for batch in planned:
                rows = _archive_batch(spark, control, db, batch, deleter, partition_rows,
                                      max_connections, timer)
                if rows:
                    result.rows[kind] += rows
                    result.committed.append(batch.name)
                    if progress is not None:
                        progress(f"batch {batch.name}: {rows} rows written and verified")
        result.deleted = deleter.finish()
        timer.step("wait for the last delete")
        _tend(db.alias, cutoff, result, progress)
        timer.step("partitions")
        result.dropped = [name for name, outcome in control.drops.items()
                          if outcome == "dropped"]
        result.not_dropped = {name: outcome for name, outcome in control.drops.items()
                              if outcome != "dropped"}
    finally:
        if deleter.is_alive():
            deleter.stop()
        statements.release_archive_lock(db.alias)
    result.seconds = time.monotonic() - started
    result.timings["delete (beside the next batch)"] = deleter.seconds
    if control.drops:
        result.timings["history table locked for drops"] = (partitions.held["seconds"]
                                                            - held_before)
    return result
