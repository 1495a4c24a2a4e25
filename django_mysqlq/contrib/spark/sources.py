"""History as one DataFrame: the live table and the Parquet archive together.

Both sides come out with the live read's columns (times as microseconds since the
epoch). A row can be in both for a moment (archived, not yet deleted): the archive's
copy wins, the live one is dropped by id, so nothing is counted twice.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ...broker import pipeline as statements
from .database import Database
from .errors import PipelineError
from .layout import CONTROL, HISTORY, HISTORY_SCHEMA, OWNER, join
from .reading import plan, read
from .store import Store

TIME_COLUMNS = {"enqueued_us": "enqueued_at", "started_us": "started_at",
                "finished_us": "finished_at"}


def _micros(value: dt.datetime) -> int:
    return int((value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds() * 1_000_000)


def live_history(spark: SparkSession, db: Database, since: dt.datetime, until: dt.datetime,
                 columns: str, partition_rows: int | None = None,
                 max_connections: int | None = None) -> DataFrame | None:
    """History finished in ``[since, until)`` from MySQL, or None if there is none."""
    bounds = statements.window_bounds(since, until, db.alias)
    if bounds is None:
        return None
    table = statements.HISTORY_SELECT.format(columns=columns,
                                             where=statements.window_where(since, until))
    return read(spark, db, table, plan(*bounds, partition_rows, max_connections))


def check_owner(spark: SparkSession, root: str, db: Database) -> None:
    """Refuse an archive root another database's ``archive`` wrote (ids of two databases
    overlap: its rows would be counted, or replayed, as this one's). A root no archive
    has written to yet is anyone's."""
    path = join(root, CONTROL, OWNER)
    store = Store(spark, root)
    if not store.exists(path):
        return
    owner = store.read_text(path).strip()
    if owner != db.identity:
        raise PipelineError(f"The archive at {root} holds the database {owner}, not "
                            f"{db.identity} (--database {db.alias}): give --archive the "
                            "root this database's archive writes to (its --to), or "
                            "--database the alias of that archive's database.")


def archived_history(spark: SparkSession, root: str, since: dt.datetime,
                     until: dt.datetime, names: Sequence[str]) -> DataFrame | None:
    """History finished in ``[since, until)`` from the archive at ``root``, as columns
    ``names`` (``*_us`` ones as microseconds), or None if the archive has none yet."""
    path = join(root, HISTORY)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(hadoop_path):
        return None
    frame = spark.read.schema(HISTORY_SCHEMA).option("basePath", path).parquet(path)
    # ``day`` is the UTC date of ``finished_at``: a bound in another zone (``--until
    # 23:00-05:00``) has another date there, and would drop the UTC day it reaches into.
    first, last = since.astimezone(dt.UTC).date(), until.astimezone(dt.UTC).date()
    frame = frame.where((F.col("day") >= F.lit(first - dt.timedelta(days=1)))
                        & (F.col("day") <= F.lit(last)))
    for micros, name in TIME_COLUMNS.items():
        frame = frame.withColumn(micros, F.unix_micros(F.col(name)))
    frame = frame.where((F.col("finished_us") >= _micros(since))
                        & (F.col("finished_us") < _micros(until)))
    return frame.select(*names)


def history(spark: SparkSession, db: Database, since: dt.datetime, until: dt.datetime,
            columns: str, archive: str | None, partition_rows: int | None = None,
            max_connections: int | None = None) -> tuple[DataFrame | None, bool, bool]:
    """Live and archived history of the window, each row once.

    Returns the frame (None when neither side has rows), and whether each side had any.
    """
    live = live_history(spark, db, since, until, columns, partition_rows, max_connections)
    names = live.columns if live is not None else [
        part.strip().rsplit(" AS ", 1)[-1].strip()
        for part in _split_columns(columns)]
    archived = archived_history(spark, archive, since, until, names) if archive else None
    if live is None:
        return archived, False, archived is not None
    if archived is None:
        return live, True, False
    live = live.join(archived.select("id"), "id", "left_anti")
    return live.unionByName(archived), True, True


def _split_columns(columns: str) -> list[str]:
    """Top-level comma-separated items of a column list (commas in calls don't split)."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in columns:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return items
