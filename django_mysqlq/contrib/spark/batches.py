"""One archive batch from start to end, and the recovery of batches a killed run left.

A batch is an id range of one kind (``history`` or ``dead``). Its life, each step safe
to be killed in:

1. **staged**: Spark writes its rows to ``_mysqlq/staging/<batch>/`` (Parquet, by day
   and queue). Killed here: the next run deletes the staging; the rows are still in
   MySQL and are archived again.
2. **verified**: per day and queue, the rows, sum, first and last id read back from the
   staged files equal what the source holds (else the staging is dropped).
3. **committed**: ``_mysqlq/batches/<batch>.json`` is written (atomically), naming each
   staged file and its final place. From here the batch is archived: a next run rolls
   it forward.
4. **moved**: the staged files are renamed to ``<kind>/day=…/queue=…/part-<batch>-N.parquet``.
5. **deleted**: a batch that is all of one partition of a partitioned history table
   (:mod:`...broker.partitions`), whose record names that partition and its rows, sum,
   first and last id, drops the partition if it still holds exactly those rows (checked
   under a table lock, just before); else, or if that lock is not granted soon, its
   rows are deleted as every other batch's are. Otherwise, exactly the ids read back
   from those files (in step 2's read; a run finishing an interrupted batch reads the
   final files again) are deleted from MySQL, a
   short autocommit statement per ``delete_batch`` ids; then ``<batch>.done`` is written
   and the staging removed. Deleting an id twice is a no-op, so a run killed anywhere in
   here is finished by the next one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
from collections.abc import Iterator
from typing import Any

from django.db import connections
from pyspark.sql import DataFrame, SparkSession

from ...broker import archive as statements
from ...broker import partitions, topic_retention
from .errors import PipelineError
from .hooks import checkpoint
from .layout import CONTROL, HISTORY, OWNER, PARTITIONS, SCHEMAS, TOPICS, join
from .store import Store

STAGING = "staging"
BATCHES = "batches"
PartitionStats = statements.PartitionStats


@dataclasses.dataclass(frozen=True)
class Batch:
    kind: str
    low: int
    high: int  # exclusive
    cutoff: dt.datetime
    name: str
    #: For ``topics``: the topic, and ``low``/``high`` are offsets, not ids.
    topic: str | None = None
    #: For history in a partitioned table: the partition (name, upper bound) this batch
    #: is all of, dropped instead of deleted row by row if it holds exactly these rows.
    partition: tuple[str, int] | None = None

    def record(self, files: list[tuple[str, str]], stats: PartitionStats,
               drop: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"batch": self.name, "kind": self.kind, "topic": self.topic, "drop": drop,
                "low": self.low, "high": self.high,
                "cutoff": self.cutoff.isoformat(), "rows": sum(s[0] for s in stats.values()),
                "partitions": [[day, queue, *figures]
                               for (day, queue), figures in sorted(stats.items())],
                "files": files}


class Control:
    """The archive's bookkeeping under ``<root>/_mysqlq``."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root
        self.store = Store(spark, root)
        #: Partitions whose drop this run tried: ``{name: outcome}`` (see
        #: :func:`...broker.partitions.drop_archived`).
        self.drops: dict[str, str] = {}

    def staging(self, name: str) -> str:
        return join(self.root, CONTROL, STAGING, name)

    def record_path(self, name: str) -> str:
        return join(self.root, CONTROL, BATCHES, f"{name}.json")

    def done_path(self, name: str) -> str:
        return join(self.root, CONTROL, BATCHES, f"{name}.done")

    def staged_names(self) -> list[str]:
        return self.store.list_dir(join(self.root, CONTROL, STAGING))

    def records(self) -> dict[str, bool]:
        """``{batch: done}`` for every committed batch."""
        names = self.store.list_dir(join(self.root, CONTROL, BATCHES))
        done = {name[:-5] for name in names if name.endswith(".done")}
        return {name[:-5]: name[:-5] in done for name in names if name.endswith(".json")}

    def claim_database(self, identity: str) -> None:
        """Tie this archive root to one database (ids of two databases overlap: a run on
        one must never finish, and delete, a batch of the other's); refuse another."""
        path = join(self.root, CONTROL, OWNER)
        if self.store.exists(path):
            owner = self.store.read_text(path).strip()
            if owner != identity:
                raise PipelineError(f"The archive at {self.root} holds the database {owner}, "
                                    f"not {identity}: give each database its own --to.")
            return
        self.store.write_text(path, identity + "\n")

    def read_record(self, name: str) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(self.store.read_text(self.record_path(name)))
        return record


#: Columns whose values are (nearly) all different: Parquet's writer would build a
#: dictionary for each page of them only to drop it. Without: the archive's Parquet
#: write takes about a third less CPU (1M history rows: 10 -> 7 CPU seconds), and its
#: files are no bigger (docs/performance.md).
NO_DICTIONARY = ("id", "message_id", "enqueued_at", "started_at", "finished_at", "died_at",
                 "offset", "published_at", "sequenced_at", "payload", "error_message",
                 "result", "traceback", "last_error")


def stage(control: Control, batch: Batch, rows: DataFrame) -> bool:
    """Write the batch's rows to its staging; False if it has none."""
    staging = control.staging(batch.name)
    control.store.delete(staging)
    options = {f"parquet.enable.dictionary#{column}": "false" for column in NO_DICTIONARY
               if column in rows.columns}
    rows.write.mode("overwrite").options(**options).partitionBy(*PARTITIONS[batch.kind]).parquet(
        staging)
    checkpoint("written")
    return bool(staged_files(control, batch.name))


def staged_files(control: Control, name: str) -> list[str]:
    return [path for path in control.store.list_files(control.staging(name))
            if path.endswith(".parquet")]


def _read(spark: SparkSession, kind: str, base: str, paths: list[str]) -> DataFrame:
    return spark.read.schema(SCHEMAS[kind]).option("basePath", base).parquet(*paths)


@dataclasses.dataclass(frozen=True)
class Written:
    """What a batch's staged files hold, read back from them once."""

    #: Per day and queue: rows, sum, first and last id.
    stats: PartitionStats
    #: First and last finish time of the history rows (None: no rows, or dead messages).
    span: tuple[dt.datetime, dt.datetime] | None
    #: Every id the files hold, sorted (topic messages: in offset order): what the
    #: batch's delete removes, exactly.
    ids: list[int]


def _sorted_ids(table: Any, kind: str) -> list[int]:
    if kind == TOPICS:
        order = table.sort_by([("offset", "ascending")])
        return [int(i) for i in order.column("id").to_pylist()]
    ids: list[int] = table.column("id").to_pylist()
    ids.sort()
    return ids


def _read_back_columns(kind: str) -> list[str]:
    extra = ["finished_at"] if kind == HISTORY else ["offset"] if kind == TOPICS else []
    return ["id", "day", PARTITIONS[kind][1], *extra]


def read_back(frame: DataFrame, kind: str) -> Written:
    """Read the files' ids, partitions and times once (one Spark scan of a few columns,
    handed to the driver as Arrow) and sum them up per partition on the driver."""
    return _written(frame.select(*_read_back_columns(kind)).toArrow(), kind)


def read_back_local(directory: str, kind: str) -> Written:
    """:func:`read_back` of files on this machine, read by pyarrow on the driver: the
    same columns and partitions (``day=…/<group>=…`` directories, values unescaped as
    Spark escaped them) without a Spark job (about half a second a batch)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    group = PARTITIONS[kind][1]
    partitioning = ds.partitioning(pa.schema([("day", pa.date32()), (group, pa.string())]),
                                   flavor="hive")
    dataset = ds.dataset(directory, format="parquet", partitioning=partitioning)
    if not dataset.files:
        return Written({}, None, [])
    return _written(dataset.to_table(columns=_read_back_columns(kind)), kind)


def _written(table: Any, kind: str) -> Written:
    """The per-partition sums, the time span and the sorted ids of a read-back table."""
    import pyarrow.compute as pc

    group = PARTITIONS[kind][1]
    grouped = table.group_by(["day", group]).aggregate(
        [("id", "count"), ("id", "sum"), ("id", "min"), ("id", "max")]).to_pylist()
    stats = {(row["day"].isoformat(), str(row[group])): (
        int(row["id_count"]), int(row["id_sum"]), int(row["id_min"]), int(row["id_max"]))
        for row in grouped}
    span = None
    if table.num_rows and kind == HISTORY:
        bounds = pc.min_max(table.column("finished_at").cast("int64"))
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        span = (epoch + dt.timedelta(microseconds=bounds["min"].as_py()),
                epoch + dt.timedelta(microseconds=bounds["max"].as_py()))
    return Written(stats, span, _sorted_ids(table, kind))


def source_stats(batch: Batch, alias: str,
                 span: tuple[dt.datetime, dt.datetime] | None) -> PartitionStats:
    if batch.kind == TOPICS:
        assert batch.topic is not None
        return topic_retention.topic_partition_stats(batch.topic, batch.low, batch.high, alias)
    if batch.kind == HISTORY:
        if span is None:
            return {}
        return statements.history_partition_stats(batch.low, batch.high, batch.cutoff, span,
                                                  alias)
    return statements.dead_partition_stats(batch.low, batch.high, batch.cutoff, alias)


def verify(control: Control, batch: Batch, alias: str) -> Written:
    """Compare the staged files with the source, per partition; raise if they differ.

    Returns what the files hold, their ids included: the files are renamed, not
    rewritten, so these are the ids the committed batch's delete must remove.
    """
    staging = control.staging(batch.name)
    local = control.store.os_path(staging)
    written = (read_back(_read(control.spark, batch.kind, staging, [staging]), batch.kind)
               if local is None else read_back_local(local, batch.kind))
    source = source_stats(batch, alias, written.span)
    if written.stats != source:
        differing = sorted(set(written.stats.items()) ^ set(source.items()))[:4]
        raise BatchMismatch(
            f"Archive batch {batch.name}: the Parquet files written and the database "
            f"disagree on {differing} (day, queue or topic, (rows, sum of ids, first id, "
            "last id)). "
            "The source changed during the batch (a purge, or a row committed late).")
    checkpoint("verified")
    return written


class BatchMismatch(PipelineError):
    """What was written is not what the source holds: the batch is dropped, not deleted."""


def drop_plan(batch: Batch, written: Written, alias: str) -> dict[str, Any] | None:
    """For a batch that is all of one partition: the drop its record names, if the
    partition holds exactly the rows written (else None: its rows are deleted one by one,
    a row of it that was not archived staying)."""
    if batch.partition is None or not written.stats:
        return None
    name, high = batch.partition
    figures = list(written.stats.values())
    wrote = (sum(f[0] for f in figures), sum(f[1] for f in figures),
             min(f[2] for f in figures), max(f[3] for f in figures))
    holds = partitions.totals(name, alias)
    if holds != wrote:
        return None
    return {"partition": name, "high": high, "totals": list(wrote)}


def commit(control: Control, batch: Batch, stats: PartitionStats,
           drop: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the batch's record: from here on the batch is archived."""
    moves = []
    for index, path in enumerate(staged_files(control, batch.name)):
        directory = path.rsplit("/", 1)[0]
        moves.append((path, f"{batch.kind}/{directory}/part-{batch.name}-{index:05d}.parquet"))
    record = batch.record(moves, stats, drop)
    # On a local disk the files must be there before the record says they are, and the
    # record before any row is deleted (a power cut must not leave only the record).
    control.store.sync_tree(control.staging(batch.name), control.root)
    path = control.record_path(batch.name)
    control.store.write_text(path, json.dumps(record, indent=1))
    control.store.sync_files([path], control.root)
    checkpoint("committed")
    return record


def move(control: Control, record: dict[str, Any]) -> list[str]:
    """Rename the staged files into the archive (again: those not moved yet)."""
    finals = []
    staging = control.staging(record["batch"])
    for source, target in record["files"]:
        final = join(control.root, target)
        if not control.store.exists(final):
            if not control.store.rename(join(staging, source), final):
                raise PipelineError(
                    f"Archive batch {record['batch']} is committed but its file {source} "
                    f"is neither in the staging ({staging}) nor at {final}: the archive "
                    "was changed by hand. Restore the file, or delete the batch's record "
                    f"{control.record_path(record['batch'])} to archive its rows again.")
            checkpoint("renamed")
        finals.append(final)
    # The renames reach the disk before the delete (and the staging's removal after it).
    control.store.sync_files(finals, control.root)
    return finals


def archived_ids(control: Control, record: dict[str, Any], finals: list[str]) -> list[int]:
    """The ids a committed batch's files hold (what its delete must remove, exactly)."""
    base = join(control.root, record["kind"])
    columns = ["id", "offset"] if record["kind"] == TOPICS else ["id"]
    table = _read(control.spark, record["kind"], base, finals).select(*columns).toArrow()
    ids = _sorted_ids(table, record["kind"])
    if len(ids) != record["rows"]:
        raise PipelineError(f"Archive batch {record['batch']}: its files hold {len(ids)} rows "
                            f"but its record says {record['rows']}; nothing deleted.")
    return ids


def chunks(ids: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(ids), size):
        yield ids[start:start + size]


#: Connections deleting one batch at once (each its own every-other statement).
DELETE_THREADS = 2


def drop(control: Control, record: dict[str, Any], alias: str) -> int | None:
    """Drop the partition a batch's record names, if it still holds exactly the batch's
    rows; the rows it held (then marks the batch done), or None: delete them instead."""
    plan = record.get("drop")
    if plan is None:
        return None
    checkpoint("dropping")
    outcome = partitions.drop_archived(plan["partition"], plan["high"], tuple(plan["totals"]),
                                       alias)
    control.drops[plan["partition"]] = outcome
    if outcome != "dropped":
        return None
    checkpoint("dropped")
    return _done(control, record, int(plan["totals"][0]))


def delete(control: Control, record: dict[str, Any], ids: list[int], alias: str,
           delete_batch: int, *, try_drop: bool = True) -> int:
    """Delete the batch's ids from MySQL (on :data:`DELETE_THREADS` connections; topic
    messages on one, in offset order, so that what is kept stays ``first_offset … last``),
    mark it done, drop its staging. A batch whose record names a partition to drop
    drops it instead, if it still holds exactly the batch's rows."""
    if try_drop and (dropped := drop(control, record, alias)) is not None:
        return dropped
    cutoff = dt.datetime.fromisoformat(record["cutoff"])
    parts = list(chunks(ids, delete_batch))
    threads = 1 if record["kind"] == TOPICS else DELETE_THREADS
    counts = [0] * threads
    errors: list[BaseException] = []

    def work(lane: int) -> None:
        try:
            for part in parts[lane::threads]:
                if record["kind"] == TOPICS:
                    counts[lane] += topic_retention.delete_archived(record["topic"], part,
                                                                    alias)
                elif record["kind"] == HISTORY:
                    counts[lane] += statements.delete_history(part, alias, cutoff)
                else:
                    counts[lane] += statements.delete_dead(part, cutoff, alias)
                checkpoint("deleting")
        except BaseException as exc:  # noqa: BLE001  (raised below, in the caller)
            errors.append(exc)
        finally:
            connections[alias].close()

    lanes = [threading.Thread(target=work, args=(lane,), name=f"mysqlq-archive-delete-{lane}")
             for lane in range(threads)]
    for lane in lanes:
        lane.start()
    for lane in lanes:
        lane.join()
    if errors:
        if isinstance(errors[0], topic_retention.GroupMovedBack):
            # Not marked done: the next run deletes the rest once the group passed them.
            raise PipelineError(f"Archive batch {record['batch']}: {errors[0]}"
                                ) from errors[0]
        raise errors[0]
    checkpoint("deleted")
    return _done(control, record, sum(counts))


def _done(control: Control, record: dict[str, Any], deleted: int) -> int:
    control.store.write_text(control.done_path(record["batch"]), f"{deleted}\n")
    control.store.delete(control.staging(record["batch"]))
    return deleted


@dataclasses.dataclass
class Recovered:
    """What a run found left over by an earlier, interrupted one."""

    #: Committed batches it finished (moved and deleted).
    finished: list[str] = dataclasses.field(default_factory=list)
    #: Rows those batches deleted now.
    deleted: int = 0
    #: Staged batches that were never committed, dropped (their rows are still in MySQL).
    dropped: list[str] = dataclasses.field(default_factory=list)


def pending(control: Control) -> tuple[list[str], list[str]]:
    """``(committed batches not done, staged batches not committed)``."""
    records = control.records()
    unfinished = sorted(name for name, done in records.items() if not done)
    orphans = sorted(name for name in control.staged_names()
                     if name not in records or records[name])
    return unfinished, orphans


def recover(control: Control, alias: str, delete_batch: int) -> Recovered:
    """Finish what an interrupted run committed; drop what it staged and did not."""
    recovered = Recovered()
    unfinished, orphans = pending(control)
    for name in unfinished:
        record = control.read_record(name)
        finals = move(control, record)
        ids = archived_ids(control, record, finals)
        recovered.deleted += delete(control, record, ids, alias, delete_batch)
        recovered.finished.append(name)
    for name in orphans:
        control.store.delete(control.staging(name))
        if name not in unfinished:
            recovered.dropped.append(name)
    return recovered
