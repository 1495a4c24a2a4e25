"""Parallel reads of the live tables: slices of the primary key, a bounded few at a time.

A read is planned on the driver from the id range of what it wants (one index walk,
:mod:`django_mysqlq.broker.pipeline`), cut into slices of ``SPARK_PARTITION_ROWS`` ids,
each one JDBC partition running one autocommit ``SELECT`` at READ COMMITTED along the
primary key. ``coalesce`` then folds the slices into at most ``SPARK_MAX_CONNECTIONS``
tasks, each reading its slices one after another: that many connections at most, and
every statement short, whatever the cluster's size.

Consistency: each slice is a consistent snapshot of its own rows as of its statement;
the read as a whole is not one snapshot. Rows committed while a read runs may or may
not be in it, but nothing past the id range planned at its start. History is
append-only, so a report over a window that ended before it started reads exactly
what the window holds.
"""

from __future__ import annotations

import dataclasses

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ...conf import get_settings
from .database import Database


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """The id slices of one read and the bound on its connections."""

    low: int
    high: int  # inclusive
    partition_rows: int
    max_connections: int

    def slices(self) -> list[tuple[int, int]]:
        """Half-open ``[start, end)`` id slices covering ``low..high``."""
        step = max(1, self.partition_rows)
        return [(start, min(start + step, self.high + 1))
                for start in range(self.low, self.high + 1, step)]


def plan(low: int, high: int, partition_rows: int | None = None,
         max_connections: int | None = None) -> ReadPlan:
    settings = get_settings()
    return ReadPlan(low, high, partition_rows or settings.SPARK_PARTITION_ROWS,
                    max_connections or settings.SPARK_MAX_CONNECTIONS)


def read(spark: SparkSession, db: Database, table_sql: str, read_plan: ReadPlan,
         key: str = "id") -> DataFrame:
    """Read ``table_sql`` (a derived table with a ``key`` column, indexed) slice by slice."""
    predicates = [f"{key} >= {start} AND {key} < {end}" for start, end in read_plan.slices()]
    frame = spark.read.jdbc(db.url, table_sql, predicates=predicates,
                            properties=db.jdbc_properties())
    if len(predicates) > read_plan.max_connections:
        frame = frame.coalesce(read_plan.max_connections)
    return frame


def micros_to_timestamp(frame: DataFrame, columns: dict[str, str]) -> DataFrame:
    """Replace ``<name>_us`` microsecond columns by timestamps named ``columns[name_us]``."""
    for micros, name in columns.items():
        frame = frame.withColumn(name, F.timestamp_micros(F.col(micros))).drop(micros)
    return frame
