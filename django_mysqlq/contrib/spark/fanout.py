"""``enqueue``: one message per row of a dataset, written by the executors in parallel.

The driver checks everything that can be checked before a row moves (the task is
registered, the options are valid, the columns exist and can be JSON); then each of at
most ``SPARK_MAX_CONNECTIONS`` partitions encodes its rows and inserts them through the
broker's multi-row path (:mod:`django_mysqlq.broker.fanout`) on its own connection.
Every message gets a deterministic dedup key (:func:`.arguments.dedup_key`: task, queue
and the row's arguments, or its ``dedup_column``), so a retried or speculative Spark
task, or a re-run of the same input while its messages are still queued, enqueues
nothing twice.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from ... import calls, limits
from ...broker import wake
from ...conf import get_settings
from ...exceptions import TaskArgumentError, UnknownTask
from ...registry import import_task_modules, registry
from ...routing import alias_for_queue
from .arguments import Mapping as ArgumentMapping
from .arguments import check_schema, converter, dedup_key, identity_text
from .database import database
from .errors import PipelineError
from .executor import connect, setup_django

if TYPE_CHECKING:
    from ...tasks import QueueTask

#: Messages an executor encodes before it hands them to the broker's insert.
FLUSH_ROWS = 5_000
RESULT_SCHEMA = "rows long, inserted long, bad long, sample string"
FORMATS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json",
           ".ndjson": "json"}
#: Seconds between the driver's wake-ups of parked workers while executors write.
WAKE_SECONDS = 1.0


@dataclasses.dataclass
class EnqueueResult:
    rows: int
    enqueued: int
    #: Rows whose message was already pending (same dedup key): not enqueued again.
    duplicates: int
    #: Rows whose values can't be task arguments, and one of them with the reason.
    bad_rows: int
    bad_sample: str
    seconds: float


def read_input(spark: SparkSession, path: str, fmt: str | None = None) -> DataFrame:
    """A Parquet, CSV (with a header) or JSON-lines dataset, by ``fmt`` or extension."""
    if fmt is None:
        extension = os.path.splitext(path.rstrip("/"))[1].lower()
        fmt = FORMATS.get(extension, "parquet")
    if "://" not in path and not os.path.exists(path):
        raise PipelineError(f"--input {path}: no such file or directory.")
    try:
        reader = spark.read
        if fmt == "csv":
            reader = reader.option("header", "true").option("inferSchema", "true")
        return reader.format(fmt).load(path)
    except AnalysisException as exc:
        raise PipelineError(f"--input {path} can't be read as {fmt}: "
                            f"{str(exc).splitlines()[0]}") from exc


def read_query(spark: SparkSession, query: str, database_alias: str | None = None) -> DataFrame:
    """The rows of ``query`` on the queue's database (or ``database_alias``), over JDBC."""
    db = database(database_alias)
    try:
        return spark.read.jdbc(db.url, f"({query}) AS input", properties=db.jdbc_properties())
    except Exception as exc:
        raise PipelineError(f"--query failed: {str(exc).splitlines()[0][:500]}") from exc


def _spec(task_name: str, queue: str, priority: int, delay: float, mapping: ArgumentMapping,
          frame: DataFrame, connect_args: dict[str, Any]) -> dict[str, Any]:
    task = registry.get(task_name)
    fields = {field.name: field.dataType for field in frame.schema.fields}
    return {"task": task_name, "queue": queue, "priority": priority, "delay": delay,
            "max_attempts": task.max_attempts, "retry_backoff": task.retry_backoff,
            "timeout": task.timeout, "max_bytes": get_settings().MAX_PAYLOAD_BYTES,
            "args": list(mapping.args), "kwargs": list(mapping.kwargs),
            "dedup": mapping.dedup_column, "connect": connect_args,
            "convert": {name: converter(fields[name]) for name in mapping.columns}}


def _writer(spec: dict[str, Any]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The executors' function: encode each row, insert new messages, report counts."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        setup_django()
        from django_mysqlq import payload
        from django_mysqlq.broker import fanout
        from django_mysqlq.exceptions import ArgumentEncodingError, PayloadTooLarge
        from django_mysqlq.messages import NewMessage

        counts = {"rows": 0, "inserted": 0, "bad": 0}
        sample = ""
        like = NewMessage(task_name=spec["task"], queue=spec["queue"],
                          priority=spec["priority"], payload="", run_at=None,
                          delay=spec["delay"], max_attempts=spec["max_attempts"],
                          retry_backoff=spec["retry_backoff"], timeout=spec["timeout"],
                          dedup_key="")
        task, queue, dedup, max_bytes = spec["task"], spec["queue"], spec["dedup"], \
            spec["max_bytes"]
        conn = connect(spec["connect"])
        try:
            room = fanout.prepare(conn)
            pending: list[tuple[str, str]] = []
            for batch in batches:
                columns = {}
                for name, convert in spec["convert"].items():
                    values = batch.column(name).to_pylist()
                    columns[name] = [convert(v) for v in values] if convert else values
                positional = [columns[name] for name in spec["args"]]
                named = [(key, columns[name]) for key, name in spec["kwargs"]]
                identities = columns[dedup] if dedup else None
                for index in range(batch.num_rows):
                    args = [values[index] for values in positional]
                    kwargs = {key: values[index] for key, values in named}
                    try:
                        if identities is not None and identities[index] is None:
                            raise ValueError(f"its --dedup-column {dedup} is null")
                        text = payload.encode(task, args, kwargs, max_bytes)
                    except (ArgumentEncodingError, PayloadTooLarge, ValueError) as exc:
                        counts["bad"] += 1
                        if not sample:
                            sample = f"{exc} Row: args={args!r:.300} kwargs={kwargs!r:.300}"
                        continue
                    identity = text if identities is None else identity_text(identities[index])
                    pending.append((text, dedup_key(task, queue, identity)))
                    if len(pending) >= FLUSH_ROWS:
                        counts["inserted"] += fanout.insert_encoded(conn, like, pending, room)
                        pending = []
                counts["rows"] += batch.num_rows
            if pending:
                counts["inserted"] += fanout.insert_encoded(conn, like, pending, room)
        finally:
            conn.close()
        yield pa.RecordBatch.from_pydict({**{k: [v] for k, v in counts.items()},
                                          "sample": [sample]})

    return write


class Waker(threading.Thread):
    """Wakes parked workers of the queues every second while executors write."""

    def __init__(self, queues: Sequence[str], alias: str) -> None:
        super().__init__(name="mysqlq-pipeline-waker", daemon=True)
        self.queues, self.alias = list(queues), alias
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(WAKE_SECONDS):
                try:
                    wake(self.queues, self.alias, everyone=True)
                except DatabaseError:
                    pass  # workers poll anyway; a wake-up is only a shortcut
        finally:
            connections[self.alias].close()

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        try:
            wake(self.queues, self.alias, everyone=True)
        except DatabaseError:
            pass


def _spread(frame: DataFrame, parts: int) -> DataFrame:
    """Exactly ``parts`` partitions: at most that many connections, all of them used."""
    current = frame.rdd.getNumPartitions()
    if current > parts:
        return frame.coalesce(parts)
    if current < parts:
        return frame.repartition(parts)
    return frame


def _queue_database(queue: str, database_alias: str | None) -> str:
    """The queue's own alias (``MYSQLQ['QUEUES']``, a router, ``MYSQLQ['DATABASE']``);
    a ``--database`` that names another one is refused (the messages would sit where no
    worker of the queue looks)."""
    own = alias_for_queue(queue)
    if database_alias is not None and database_alias != own:
        raise PipelineError(f"Queue {queue!r} lives on database {own!r}, not "
                            f"{database_alias!r}: leave out --database, or give {own!r}.")
    return own


def bulk_problem(task: QueueTask[Any, Any]) -> str | None:
    """What the bulk insert would drop from this task's messages, or None.

    It writes plain rows (:mod:`django_mysqlq.broker.fanout`): no gate key, no rate-limit
    key, no unique period. A task that declares one of them would get messages that run
    out of order, over its concurrency or rate limit, or twice."""
    declared = []
    if task.gate.ordered:
        declared.append("ordered_by (one message per key at a time, in order)")
    elif task.gate.limit is not None:
        declared.append(f"concurrency_limit={task.gate.limit}")
    if task.rate is not None:
        declared.append(f"rate_limit={task.rate.spec!r}")
    if task.unique_for is not None:
        declared.append(f"unique_for={task.unique_for}")
    if not declared:
        return None
    return (f"Task {task.name!r} declares {' and '.join(declared)}, which the pipeline's "
            "bulk insert does not apply: its messages would be written without it.")


def _check_signature(task: QueueTask[Any, Any], mapping: ArgumentMapping) -> None:
    """Bind the mapping to the task's signature (a column name standing in for each
    value): a misspelt keyword or one column too many would otherwise write a message
    per row, each failing on its worker with TypeError."""
    placeholders = list(mapping.args)
    named = {key: column for key, column in mapping.kwargs}
    try:
        calls.check_call(task.name, task.func, placeholders, named,
                         skip_first=task.takes_context, where="--args/--kwargs: ")
    except TaskArgumentError as exc:
        raise PipelineError(str(exc)) from None


def enqueue(frame: DataFrame, task: str, *, args: Sequence[str] = (),
            kwargs: Mapping[str, str] | None = None, queue: str | None = None,
            priority: int | None = None, delay: float | dt.timedelta = 0.0,
            dedup_column: str | None = None, database_alias: str | None = None,
            max_connections: int | None = None) -> EnqueueResult:
    """Enqueue ``task`` once per row of ``frame``; return what happened.

    ``args`` names the columns of the positional arguments, ``kwargs`` maps argument
    names to columns. ``queue`` and ``priority`` default to the task's.
    """
    started = time.monotonic()
    import_task_modules()
    try:
        registered = registry.get(task)
    except UnknownTask as exc:
        raise PipelineError(f"--task {task!r} is not a registered task ({exc})") from exc
    queue = registered.queue if queue is None else queue
    priority = registered.priority if priority is None else priority
    seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else float(delay)
    for problem in (limits.queue_problem(queue, "--queue"),
                    limits.priority_problem(priority, "--priority"),
                    limits.delay_problem(seconds, "--delay")):
        if problem:
            raise PipelineError(problem)
    mapping = ArgumentMapping(tuple(args), tuple((kwargs or {}).items()), dedup_column)
    check_schema(frame.schema, mapping)
    if problem := bulk_problem(registered):
        raise PipelineError(f"{problem} Enqueue them through the task instead "
                            "(task.enqueue_many() in a job of your own applies it); "
                            "nothing was enqueued.")
    _check_signature(registered, mapping)
    db = database(_queue_database(queue, database_alias))
    spec = _spec(task, queue, priority, seconds, mapping, frame, db.connect_args)
    parts = max_connections or get_settings().SPARK_MAX_CONNECTIONS
    selected = _spread(frame.select(*mapping.columns), parts)
    waker = Waker([queue], db.alias)
    waker.start()
    try:
        results = selected.mapInArrow(_writer(spec), RESULT_SCHEMA).collect()
    finally:
        waker.stop()
    rows = sum(row["rows"] for row in results)
    enqueued = sum(row["inserted"] for row in results)
    bad = sum(row["bad"] for row in results)
    sample = next((row["sample"] for row in results if row["sample"]), "")
    return EnqueueResult(rows=rows, enqueued=enqueued, duplicates=rows - bad - enqueued,
                         bad_rows=bad, bad_sample=sample, seconds=time.monotonic() - started)
