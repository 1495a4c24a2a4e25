"""``replay``: enqueue again the messages a filter picks from history (live and archive).

Each picked message is copied once: from its latest history row, which must be final
(the one that keeps its arguments: succeeded, failed or cancelled) and the message not
waiting or running again, with its task, queue, priority and
arguments, and its task's current attempts, backoff and timeout. Originals that
history already shows replayed are skipped, here for the count and again by each
executor inside its insert's transaction (:mod:`django_mysqlq.broker.replay`), so a
re-run with the same filter enqueues nothing twice.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ...broker import Operator, database_now
from ...broker import pipeline as statements
from ...conf import get_settings
from ...exceptions import UnknownTask
from ...models import Outcome
from ...registry import import_task_modules, registry
from ...routing import alias_for_queue
from .database import Database, database, queues_alias
from .errors import PipelineError
from .executor import connect, setup_django
from .fanout import Waker, _spread, bulk_problem
from .reading import plan, read
from .sources import check_owner, history

#: Final outcomes: the rows that keep a message's arguments.
FINAL = (Outcome.SUCCEEDED.value, Outcome.FAILED.value, Outcome.CANCELLED.value)
#: Rows that note something without changing what became of the message: a dead head's
#: subject skipped (it stays dead), a copy's link to its original.
NOTES = (Outcome.SKIPPED.value, Outcome.REPLAYED.value)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
SAMPLE = 5
RESULT_SCHEMA = "rows long, inserted long"


@dataclasses.dataclass
class ReplayResult:
    #: Messages the filter picked (one per original, latest final row).
    matched: int
    #: Of those, already replayed before (skipped).
    already_replayed: int
    #: Copies enqueued now (0 for a dry run).
    enqueued: int
    #: A few of the picked rows (message id, task, queue, outcome, error, arguments).
    sample: list[dict[str, Any]]
    dry_run: bool
    seconds: float


def replayed_originals(spark: SparkSession, db: Database, archive: str | None) -> DataFrame:
    """Ids of every original that history (live, and the archive) shows replayed."""
    bounds = statements.replayed_bounds(db.alias)
    frames = []
    if bounds is not None:
        frames.append(read(spark, db, statements.REPLAYED_SELECT, plan(*bounds))
                      .select(F.col("replayed_from").alias("message_id")))
    if archive:
        from .sources import archived_history

        archived = archived_history(spark, archive, EPOCH, dt.datetime.now(dt.UTC),
                                    ["replayed_from"])
        if archived is not None:
            frames.append(archived.where(F.col("replayed_from").isNotNull())
                          .select(F.col("replayed_from").alias("message_id")))
    if not frames:
        return spark.createDataFrame([], "message_id long")
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result.distinct()


def live_messages(spark: SparkSession, db: Database, partition_rows: int | None = None,
                  max_connections: int | None = None) -> DataFrame:
    """Ids (``message_id``) of the messages waiting or running now: an operator requeued
    them, so they are not finished, whatever their history's last row says."""
    bounds = statements.message_bounds(db.alias)
    if bounds is None:
        return spark.createDataFrame([], "message_id long")
    return read(spark, db, statements.LIVE_SELECT,
                plan(*bounds, partition_rows, max_connections)).select(
        F.col("id").alias("message_id"))


def select(frame: DataFrame, later: DataFrame | None, live: DataFrame,
           tasks: Sequence[str], queues: Sequence[str], outcomes: Sequence[str],
           error_classes: Sequence[str]) -> DataFrame:
    """The messages whose latest history row finished in the window (``frame``), is final
    and matches the filter.

    Latest over all their history: a message with a row after the window (``later``:
    requeued and succeeded since), or whose latest row is not final (requeued, waiting),
    or that is ``live`` again, is not picked; neither is a message that failed, was
    requeued and then succeeded inside the window. Notes (a skipped dead head, a
    copy's link) leave a message as it was and are never its latest row.

    An error class matches as stored (``builtins.TimeoutError``, ``shop.errors.Declined``)
    or by its last dotted part (``TimeoutError``, ``Declined``)."""
    notes = F.col("outcome").isin(*NOTES)
    latest = Window.partitionBy("message_id").orderBy(F.col("id").desc())
    frame = (frame.where(~notes).withColumn("_n", F.row_number().over(latest))
             .where(F.col("_n") == 1).drop("_n")
             .where(F.col("outcome").isin(*FINAL) & (F.col("payload") != "")))
    if later is not None:
        frame = frame.join(later.where(~notes).select("message_id"), "message_id",
                           "left_anti")
    frame = frame.join(live, "message_id", "left_anti").where(F.col("outcome").isin(*outcomes))
    if tasks:
        frame = frame.where(F.col("task_name").isin(*tasks))
    if queues:
        frame = frame.where(F.col("queue").isin(*queues))
    if error_classes:
        frame = frame.where(F.col("error_class").isin(*error_classes)
                            | F.substring_index(F.col("error_class"), ".", -1)
                            .isin(*error_classes))
    return frame


def _bulk_problem(name: str) -> str | None:
    """What the bulk insert would drop from copies of this task (see
    :func:`.fanout.bulk_problem`); None for a task this process doesn't know."""
    try:
        return bulk_problem(registry.get(name))
    except UnknownTask:
        return None


def _limits(names: list[str]) -> dict[str, tuple[int, float, float | None]]:
    conf = get_settings()
    found = {}
    for name in names:
        try:
            task = registry.get(name)
            found[name] = (task.max_attempts, task.retry_backoff, task.timeout)
        except UnknownTask:
            found[name] = (conf.MAX_ATTEMPTS, conf.RETRY_BACKOFF, None)
    return found


def _writer(spec: dict[str, Any]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        setup_django()
        # Imported here, after setup_django(): the broker needs the app registry.
        from django_mysqlq.broker import Operator as Who
        from django_mysqlq.broker import fanout
        from django_mysqlq.broker.replay import ReplayCopy, insert_replays, replay_key
        from django_mysqlq.messages import NewMessage

        operator = Who(**spec["operator"])
        rows = inserted = 0
        conn = connect(spec["connect"])
        try:
            room = fanout.prepare(conn)
            for batch in batches:
                data = batch.to_pydict()
                copies = []
                for index in range(batch.num_rows):
                    name = data["task_name"][index]
                    attempts, backoff, timeout = spec["limits"][name]
                    original = int(data["message_id"][index])
                    copies.append(ReplayCopy(
                        message=NewMessage(
                            task_name=name, queue=data["queue"][index],
                            priority=int(data["priority"][index]),
                            payload=data["payload"][index], run_at=None, delay=0.0,
                            max_attempts=attempts, retry_backoff=backoff, timeout=timeout,
                            dedup_key=replay_key(original)),
                        original=original, source_row=int(data["id"][index])))
                rows += len(copies)
                inserted += insert_replays(conn, copies, room, operator)
        finally:
            conn.close()
        yield pa.RecordBatch.from_pydict({"rows": [rows], "inserted": [inserted]})

    return write


def replay(spark: SparkSession, *, tasks: Sequence[str] = (), queues: Sequence[str] = (),
           outcomes: Sequence[str] = (Outcome.FAILED.value,),
           error_classes: Sequence[str] = (), since: dt.datetime | None = None,
           until: dt.datetime | None = None, archive: str | None = None,
           dry_run: bool = False, operator: Operator | None = None,
           database_alias: str | None = None, partition_rows: int | None = None,
           max_connections: int | None = None) -> ReplayResult:
    """Enqueue copies of the messages whose latest history row is final and matches the
    filter (see :func:`select`).

    ``outcomes`` (default ``failed``: messages that went dead) must be final outcomes.
    ``since``/``until`` bound when that row finished (default: all history).
    """
    started = time.monotonic()
    wrong = sorted(set(outcomes) - set(FINAL))
    if wrong or not outcomes:
        raise PipelineError(f"--outcome {','.join(wrong) or '(none)'}: only final rows keep "
                            f"a message's arguments; choose from {', '.join(FINAL)}.")
    db = database(queues_alias(queues, database_alias))
    until = until or database_now() + dt.timedelta(seconds=1)
    since = since or EPOCH
    if since >= until:
        raise PipelineError("--since must be before --until.")
    if archive:
        check_owner(spark, archive, db)
    frame, _, _ = history(spark, db, since, until, statements.REPLAY_COLUMNS, archive,
                          partition_rows, max_connections)
    if frame is None:
        return ReplayResult(0, 0, 0, [], dry_run, time.monotonic() - started)
    now = database_now() + dt.timedelta(seconds=1)
    later = None if until >= now else history(
        spark, db, until, now, statements.LATER_COLUMNS, archive, partition_rows,
        max_connections)[0]
    live = live_messages(spark, db, partition_rows, max_connections)
    picked = select(frame, later, live, tasks, queues, outcomes, error_classes).select(
        "id", "message_id", "queue", "task_name", "priority", "outcome", "error_class",
        "payload").cache()
    try:
        done = replayed_originals(spark, db, archive)
        fresh = picked.join(done, "message_id", "left_anti").cache()
        matched, remaining = picked.count(), fresh.count()
        sample = [row.asDict() for row in fresh.orderBy("message_id").limit(SAMPLE).collect()]
        if dry_run or not remaining:
            return ReplayResult(matched, matched - remaining, 0, sample, dry_run,
                                time.monotonic() - started)
        import_task_modules()
        pairs = fresh.select("task_name", "queue").distinct().collect()
        names = sorted({row[0] for row in pairs})
        moved = sorted({row[1] for row in pairs if alias_for_queue(row[1]) != db.alias})
        if moved:
            raise PipelineError(
                f"Queue(s) {', '.join(moved)} of this history (database {db.alias!r}) now "
                "live on another database: replay them with --queue and that queue's "
                "history, or replay the rest with --queue. Nothing was enqueued.")
        refused = [problem for name in names if (problem := _bulk_problem(name))]
        if refused:
            raise PipelineError(
                f"{' '.join(refused)} Replay the other tasks' messages (--task), and these "
                "through their task (task.enqueue() with the arguments history keeps); "
                "nothing was enqueued.")
        who = operator or Operator(name="spark:replay")
        spec = {"connect": db.connect_args, "limits": _limits(names),
                "operator": dataclasses.asdict(who)}
        parts = max_connections or get_settings().SPARK_MAX_CONNECTIONS
        waker = Waker(sorted({row[1] for row in pairs}), db.alias)
        waker.start()
        try:
            results = _spread(fresh, parts).mapInArrow(_writer(spec), RESULT_SCHEMA).collect()
        finally:
            waker.stop()
        inserted = sum(row["inserted"] for row in results)
        return ReplayResult(matched, matched - remaining, inserted, sample, False,
                            time.monotonic() - started)
    finally:
        picked.unpersist()

