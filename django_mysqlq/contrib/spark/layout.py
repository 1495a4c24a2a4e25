"""Where the archive keeps things, and the schema of what it keeps.

``<root>/history/day=YYYY-MM-DD/queue=<name>/part-<batch>-NNNNN.parquet`` holds archived
history rows (one Parquet dataset: ``spark.read.parquet("<root>/history")`` reads it),
``<root>/dead/…`` dead messages (``--include-dead``),
``<root>/topics/day=YYYY-MM-DD/topic=<name>/…`` topic messages (``--source topics``),
and ``<root>/_mysqlq/`` the archive's own bookkeeping (staged batches and their commit
records), hidden from readers by its leading underscore.
"""

from __future__ import annotations

from pyspark.sql.types import (
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HISTORY = "history"
DEAD = "dead"
TOPICS = "topics"
CONTROL = "_mysqlq"
#: ``<root>/_mysqlq/database``: the database a root archives (``host:port/name``).
OWNER = "database"
PARTITION_COLUMNS = ("day", "queue")
#: Per kind: the partition columns (the second one is the group a batch's stats name).
PARTITIONS = {HISTORY: PARTITION_COLUMNS, DEAD: PARTITION_COLUMNS, TOPICS: ("day", "topic")}
#: Per kind: the time the ``day`` partition comes from.
DAY_OF = {HISTORY: "finished_at", DEAD: "died_at", TOPICS: "published_at"}


def _fields(*items: tuple[str, object, bool]) -> list[StructField]:
    return [StructField(name, kind, nullable) for name, kind, nullable in items]  # type: ignore[arg-type]


#: The history dataset: every column of ``mysqlq_attempt``, times as UTC timestamps,
#: partitioned by ``day`` (of ``finished_at``) and ``queue``.
HISTORY_SCHEMA = StructType(_fields(
    ("id", LongType(), False), ("message_id", LongType(), False),
    ("task_name", StringType(), False), ("attempt", LongType(), False),
    ("outcome", StringType(), False), ("priority", IntegerType(), False),
    ("enqueued_at", TimestampType(), True), ("started_at", TimestampType(), True),
    ("finished_at", TimestampType(), True), ("worker_id", StringType(), True),
    ("host", StringType(), True), ("pid", LongType(), True),
    ("connection_id", LongType(), True), ("thread", StringType(), True),
    ("error_class", StringType(), True), ("error_message", StringType(), True),
    ("traceback", StringType(), True), ("result", StringType(), True),
    ("payload", StringType(), True), ("actor", StringType(), True),
    ("replayed_from", LongType(), True),
    ("day", DateType(), True), ("queue", StringType(), True),
))
#: The dead-message dataset, partitioned by ``day`` (when it died) and ``queue``.
DEAD_SCHEMA = StructType(_fields(
    ("id", LongType(), False), ("task_name", StringType(), False),
    ("payload", StringType(), True), ("status", StringType(), True),
    ("priority", IntegerType(), False), ("enqueued_at", TimestampType(), True),
    ("died_at", TimestampType(), True), ("attempts", LongType(), True),
    ("max_attempts", LongType(), True), ("retry_backoff", DoubleType(), True),
    ("timeout", DoubleType(), True), ("gate_key", StringType(), True),
    ("gate_mode", StringType(), True), ("gate_limit", LongType(), True),
    ("losses", IntegerType(), True), ("deferrals", IntegerType(), True),
    ("last_error", StringType(), True),
    ("day", DateType(), True), ("queue", StringType(), True),
))
#: The topic-message dataset: every column of ``mysqlq_topic_message`` (``offset`` and
#: ``key`` named as in the model), partitioned by ``day`` (of ``published_at``) and
#: ``topic``.
TOPIC_SCHEMA = StructType(_fields(
    ("id", LongType(), False), ("offset", LongType(), False), ("key", StringType(), True),
    ("payload", StringType(), True), ("published_at", TimestampType(), True),
    ("sequenced_at", TimestampType(), True),
    ("day", DateType(), True), ("topic", StringType(), True),
))

SCHEMAS = {HISTORY: HISTORY_SCHEMA, DEAD: DEAD_SCHEMA, TOPICS: TOPIC_SCHEMA}


def join(root: str, *parts: str) -> str:
    """``root/part/…`` for a local path or any Hadoop URI."""
    return "/".join([root.rstrip("/"), *parts])
