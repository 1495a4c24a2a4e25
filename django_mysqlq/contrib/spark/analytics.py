"""``report``: what the queue did over a window, per queue and task, from live history
and the archive together.

Counts are exact (plain sums over the rows); wait and run time percentiles are Spark's
``percentile_approx`` with ``accuracy`` :data:`ACCURACY`: the value returned for a
percentile p of n values has a rank within ``n / ACCURACY`` of ``p * n`` (a relative
rank error of 1/ACCURACY = 0.01 %).

*attempts* are the rows a worker ran (``succeeded``, ``retried``, ``failed``, ``lost``);
*cancelled* counts messages an operator or retention cancelled; other operator rows
(requeued, released, …) count nowhere. *messages* are the distinct messages attempted.
*success_rate* is succeeded / (succeeded + failed): of the messages that finished, the
share that succeeded. *failure_rate* is (retried + failed + lost) / attempts. *Wait* is
a started attempt's start minus its message's enqueue (later attempts include their
retry delay); *run* is its finish minus its start.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ...broker import database_now
from ...broker import pipeline as statements
from ...models import Outcome
from ...routing import queue_aliases, read_alias
from .database import database, queues_alias
from .errors import PipelineError
from .output import write_outputs
from .sources import check_owner, history, live_history

ACCURACY = 10_000
RELATIVE_ERROR = 1 / ACCURACY
PERCENTILES = (0.5, 0.95, 0.99)
COUNTED = ("succeeded", "retried", "failed", "lost", "cancelled")
ATTEMPTS = (Outcome.SUCCEEDED.value, Outcome.RETRIED.value, Outcome.FAILED.value,
            Outcome.LOST.value)
#: Windows up to this long get a per-minute time series; longer ones per hour.
MINUTE_BUCKETS_UP_TO = dt.timedelta(hours=6)
TOP_ERRORS = 20
SLOWEST = 10
DEFAULT_WINDOW = dt.timedelta(hours=24)


@dataclasses.dataclass
class ReportResult:
    """What a report found (also written to ``summary.json``), and where it wrote."""

    summary: dict[str, Any]
    output: str
    text: str


def _is(outcome: str) -> Column:
    return F.when(F.col("outcome") == outcome, 1).otherwise(0)


def _ms(later: str, earlier: str) -> Column:
    attempt = F.col("outcome").isin(*ATTEMPTS)
    return F.when(attempt, (F.col(later) - F.col(earlier)) / 1000.0)


#: ``level`` of a rolled-up row: per (queue, task), per queue, or the totals.
BY_TASK, BY_QUEUE, TOTALS = 0, 1, 3


def aggregate(frame: DataFrame, hours: float) -> DataFrame:
    """The report's figures per (queue, task), per queue and in total, in one pass
    (``rollup``), told apart by ``level`` (:data:`BY_TASK`, :data:`BY_QUEUE`,
    :data:`TOTALS`)."""
    attempt = F.col("outcome").isin(*ATTEMPTS)
    aggregates = [F.sum(F.when(attempt, 1).otherwise(0)).alias("attempts"),
                  *[F.sum(_is(outcome)).alias(outcome) for outcome in COUNTED]]
    for name, later, earlier in (("wait", "started_us", "enqueued_us"),
                                 ("run", "finished_us", "started_us")):
        aggregates.append(F.percentile_approx(_ms(later, earlier), list(PERCENTILES),
                                              ACCURACY).alias(f"{name}_ms"))
    keys = ("queue", "task_name")
    grouped = frame.rollup(*keys).agg(F.grouping_id().alias("level"), *aggregates)
    # Distinct messages in a pass of their own: beside percentile_approx in one
    # aggregation, Spark's rewrite of a distinct count made it about 50 times slower.
    messages = (frame.where(attempt).select(*keys, "message_id").distinct()
                .rollup(*keys).agg(F.grouping_id().alias("level"),
                                   F.count(F.lit(1)).alias("messages")))
    same = [grouped[key].eqNullSafe(messages[key]) for key in (*keys, "level")]
    grouped = (grouped.join(messages, same[0] & same[1] & same[2], "left")
               .select(grouped["*"], F.coalesce(messages["messages"], F.lit(0))
                       .alias("messages")))
    for name in ("wait", "run"):
        for index, percentile in enumerate(PERCENTILES):
            grouped = grouped.withColumn(f"{name}_ms_p{round(percentile * 100)}",
                                         F.col(f"{name}_ms")[index])
        grouped = grouped.drop(f"{name}_ms")
    finished = F.col("succeeded") + F.col("failed")
    failures = F.col("retried") + F.col("failed") + F.col("lost")
    return (grouped
            .withColumn("success_rate",
                        F.when(finished > 0, F.col("succeeded") / finished))
            .withColumn("failure_rate",
                        F.when(F.col("attempts") > 0, failures / F.col("attempts")))
            .withColumn("attempts_per_message",
                        F.when(F.col("messages") > 0, F.col("attempts") / F.col("messages")))
            .withColumn("throughput_per_hour", F.col("attempts") / F.lit(hours)))


def _level(rolled: DataFrame, level: int, keys: Sequence[str]) -> DataFrame:
    rows = rolled.where(F.col("level") == level)
    if level != TOTALS:
        rows = rows.where((F.col("attempts") > 0) | (F.col("cancelled") > 0))
    dropped = [name for name in ("queue", "task_name") if name not in keys]
    return rows.drop("level", *dropped).orderBy(*keys) if keys else rows.drop("level",
                                                                               *dropped)


def timeseries(frame: DataFrame, unit: str) -> DataFrame:
    """Attempts (and cancellations) per ``unit`` bucket, queue, task and outcome."""
    bucket = F.date_trunc(unit, F.timestamp_micros(F.col("finished_us")))
    return (frame.where(F.col("outcome").isin(*COUNTED))
            .groupBy(bucket.alias("bucket"), "queue", "task_name", "outcome")
            .agg(F.count(F.lit(1)).alias("count")))


def errors(frame: DataFrame, middle_us: int) -> DataFrame:
    """Error classes per queue and task: counts, in each half of the window, an example."""
    failed = frame.where(F.col("outcome").isin(*ATTEMPTS) & (F.col("error_class") != ""))
    late = F.col("finished_us") >= middle_us
    return (failed.groupBy("queue", "task_name", "error_class")
            .agg(F.count(F.lit(1)).alias("count"),
                 F.sum(F.when(late, 0).otherwise(1)).alias("first_half"),
                 F.sum(F.when(late, 1).otherwise(0)).alias("second_half"),
                 F.max_by("message_id", "finished_us").alias("example_message_id"),
                 F.timestamp_micros(F.max("finished_us")).alias("last_seen")))


def slowest_attempts(frame: DataFrame) -> DataFrame:
    run = (F.col("finished_us") - F.col("started_us")) / 1000.0
    return (frame.where(F.col("outcome").isin(*ATTEMPTS) & F.col("started_us").isNotNull())
            .select("queue", "task_name", "message_id", "attempt", "outcome",
                    run.alias("run_ms"),
                    F.timestamp_micros(F.col("finished_us")).alias("finished_at"))
            .orderBy(F.col("run_ms").desc()).limit(SLOWEST))


def _window(since: dt.datetime | None, until: dt.datetime | None,
            alias: str) -> tuple[dt.datetime, dt.datetime]:
    until = until or database_now()
    since = since or until - DEFAULT_WINDOW
    if since >= until:
        raise PipelineError(f"--since ({since:%Y-%m-%d %H:%M:%S}) must be before --until "
                            f"({until:%Y-%m-%d %H:%M:%S}).")
    return since, until


def by_database(frame: DataFrame) -> list[dict[str, Any]]:
    """Per database: attempts and outcomes (the report's counts, split)."""
    attempt = F.col("outcome").isin(*ATTEMPTS)
    rows = (frame.groupBy("database")
            .agg(F.sum(F.when(attempt, 1).otherwise(0)).alias("attempts"),
                 *[F.sum(_is(outcome)).alias(outcome) for outcome in COUNTED])
            .orderBy("database").collect())
    return [{key: (value if key == "database" else int(value or 0))
             for key, value in row.asDict().items()} for row in rows]


def _all_live(spark: SparkSession, since: dt.datetime, until: dt.datetime,
              partition_rows: int | None,
              max_connections: int | None) -> tuple[DataFrame | None, list[str]]:
    """Live history of the window from every database that holds queues (each read from
    its replica when it has one), with a ``database`` column naming the queue alias."""
    frame: DataFrame | None = None
    aliases = list(queue_aliases())
    for alias in aliases:
        live = live_history(spark, database(read_alias(alias)), since, until,
                            statements.REPORT_COLUMNS, partition_rows, max_connections)
        if live is None:
            continue
        live = live.withColumn("database", F.lit(alias))
        frame = live if frame is None else frame.unionByName(live)
    return frame, aliases


def report(spark: SparkSession, output: str, *, since: dt.datetime | None = None,
           until: dt.datetime | None = None, queues: Sequence[str] = (),
           tasks: Sequence[str] = (), archive: str | None = None,
           database_alias: str | None = None, partition_rows: int | None = None,
           max_connections: int | None = None,
           all_databases: bool = False) -> ReportResult:
    """Analytics over ``[since, until)`` (default: the last 24 hours) into ``output``.

    Reads live history and, with ``archive``, the Parquet archive at that path.
    Writes ``summary.json``, Parquet datasets and ``report.html`` (see
    :func:`.output.write_outputs`).

    ``all_databases`` reads the live history of every database that holds queues
    (``MYSQLQ['DATABASE']`` and the aliases of ``MYSQLQ['QUEUES']``) and reports them
    together; ``summary.json``'s ``by_database`` splits the counts per alias. It reads no
    archive (an archive root holds one database's history).
    """
    if all_databases and (database_alias or archive):
        raise PipelineError("--all-databases reads every queue database's live history: "
                            "it takes neither --database nor --archive (an archive holds "
                            "one database's history; report it with --database ALIAS).")
    # Only reads: from the queue database's replica when MYSQLQ['READ_DATABASE'] names one.
    alias = queues_alias(queues, database_alias) or queue_aliases()[0]
    db = database(read_alias(alias))
    if archive:
        # The root names the queue database its archive runs on, never its replica.
        check_owner(spark, archive, database(alias))
    since, until = _window(since, until, db.alias)
    if all_databases:
        frame, aliases = _all_live(spark, since, until, partition_rows, max_connections)
        live, archived = frame is not None, False
    else:
        frame, live, archived = history(spark, db, since, until, statements.REPORT_COLUMNS,
                                        archive, partition_rows, max_connections)
        aliases = [alias]
        if frame is not None:
            frame = frame.withColumn("database", F.lit(alias))
    if frame is None:
        frame = spark.createDataFrame([], "id long, message_id long, queue string, "
                                      "task_name string, attempt long, outcome string, "
                                      "error_class string, enqueued_us long, "
                                      "started_us long, finished_us long, "
                                      "database string")
    if queues:
        frame = frame.where(F.col("queue").isin(*queues))
    if tasks:
        frame = frame.where(F.col("task_name").isin(*tasks))
    frame = frame.cache()
    try:
        hours = (until - since).total_seconds() / 3600
        unit = "minute" if until - since <= MINUTE_BUCKETS_UP_TO else "hour"
        middle = since + (until - since) / 2
        middle_us = int((middle - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds()
                        * 1_000_000)
        rolled = aggregate(frame, hours).cache()
        frames = {
            "totals": _level(rolled, TOTALS, []),
            "by_queue": _level(rolled, BY_QUEUE, ["queue"]),
            "by_task": _level(rolled, BY_TASK, ["queue", "task_name"]),
            "timeseries": timeseries(frame, unit).orderBy("bucket", "queue", "task_name"),
            "errors": errors(frame, middle_us).orderBy(F.col("count").desc()),
            "slowest_attempts": slowest_attempts(frame),
        }
        meta = {"window": {"since": since.isoformat(), "until": until.isoformat()},
                "filters": {"queues": list(queues), "tasks": list(tasks)},
                "sources": {"live": live, "archive": archive if archived else None,
                            "databases": aliases},
                "by_database": by_database(frame),
                "bucket": unit,
                "percentiles": {"function": "percentile_approx", "accuracy": ACCURACY,
                                "relative_rank_error": RELATIVE_ERROR}}
        summary, text = write_outputs(spark, frames, meta, output)
        rolled.unpersist()
    finally:
        frame.unpersist()
    return ReportResult(summary=summary, output=output, text=text)
