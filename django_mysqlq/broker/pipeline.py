"""What the Spark pipeline reads: id bounds, and the SELECTs its partitions run.

The pipeline never reads a table in one statement: it asks here for the primary key
range of what it wants (one short index walk), then each Spark partition runs one
``SELECT`` over a slice of that range (``FORCE INDEX (PRIMARY)``), in autocommit at READ
COMMITTED: no long transaction, no locks. Times are read as microseconds since the
epoch of the stored UTC values (``TIMESTAMPDIFF``, pure arithmetic), so no session or
JVM time zone can shift them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .base import ATTEMPT_TABLE, MESSAGE_TABLE, connection_for, naive_utc
from .topics import OFFSET_INDEX, TOPIC_MESSAGE_TABLE

#: Microseconds since 1970-01-01 of a DATETIME(6) holding UTC (NULL stays NULL).
_MICROS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {column})"

#: The history columns the report needs, times as microseconds.
REPORT_COLUMNS = (
    "id, message_id, queue, task_name, attempt, outcome, error_class, "
    f"{_MICROS.format(column='enqueued_at')} AS enqueued_us, "
    f"{_MICROS.format(column='started_at')} AS started_us, "
    f"{_MICROS.format(column='finished_at')} AS finished_us"
)
#: Every history column, for the archive and for replay (times as microseconds).
HISTORY_COLUMNS = (
    "id, message_id, queue, task_name, attempt, outcome, priority, "
    f"{_MICROS.format(column='enqueued_at')} AS enqueued_us, "
    f"{_MICROS.format(column='started_at')} AS started_us, "
    f"{_MICROS.format(column='finished_at')} AS finished_us, "
    "worker_id, host, pid, connection_id, thread, error_class, error_message, traceback, "
    "result, payload, actor, replayed_from"
)
#: What replay needs of a history row (the arguments, and what a filter asks about).
REPLAY_COLUMNS = "id, message_id, queue, task_name, priority, outcome, error_class, payload"
#: What replay needs of the rows after its window: whether a message has a later one.
LATER_COLUMNS = "id, message_id, outcome"
#: Every column of a dead message, for ``archive --include-dead``.
DEAD_COLUMNS = (
    "id, queue, task_name, payload, status, priority, "
    f"{_MICROS.format(column='enqueued_at')} AS enqueued_us, "
    f"{_MICROS.format(column='run_at')} AS died_us, "
    "attempts, max_attempts, retry_backoff, timeout, gate_key, gate_mode, gate_limit, "
    "losses, deferrals, "
    "last_error"
)
#: Every column of a topic message, for ``archive --source topics``.
TOPIC_COLUMNS = (
    "id, topic, msg_offset, msg_key, payload, "
    f"{_MICROS.format(column='published_at')} AS published_us, "
    f"{_MICROS.format(column='sequenced_at')} AS sequenced_us"
)

#: The id range of history finished in a window, along mysqlq_att_finished (it holds
#: the primary key: no row is read).
WINDOW_BOUNDS_SQL = f"""
SELECT MIN(id), MAX(id) FROM {ATTEMPT_TABLE} FORCE INDEX (mysqlq_att_finished)
 WHERE finished_at >= %s AND finished_at < %s
"""
#: The id range of history finished before a time (what an archive would move).
OLDER_BOUNDS_SQL = f"""
SELECT MIN(id), MAX(id), COUNT(*) FROM {ATTEMPT_TABLE} FORCE INDEX (mysqlq_att_finished)
 WHERE finished_at < %s
"""
#: The id range of dead messages that died before a time, along mysqlq_msg_due.
DEAD_BOUNDS_SQL = f"""
SELECT MIN(id), MAX(id), COUNT(*) FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
 WHERE status = 'dead' AND run_at < %s AND gate_key IS NULL
"""
#: The id range of every history row carrying a replay link.
REPLAYED_BOUNDS_SQL = f"""
SELECT MIN(id), MAX(id) FROM {ATTEMPT_TABLE} FORCE INDEX (mysqlq_att_replayed)
 WHERE replayed_from IS NOT NULL
"""

#: The id range of the message table (its primary key's ends: no row is read).
MESSAGE_BOUNDS_SQL = f"SELECT MIN(id), MAX(id) FROM {MESSAGE_TABLE}"

#: The derived tables Spark's partitions read; each partition adds its id slice.
HISTORY_SELECT = (f"(SELECT {{columns}} FROM {ATTEMPT_TABLE} FORCE INDEX (PRIMARY) "
                  "WHERE {where}) AS history")
DEAD_SELECT = (f"(SELECT {{columns}} FROM {MESSAGE_TABLE} FORCE INDEX (PRIMARY) "
               "WHERE {where}) AS dead")
#: One topic's messages; each partition adds its slice of ``msg_offset``.
TOPIC_SELECT = (f"(SELECT {TOPIC_COLUMNS} FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
                f"({OFFSET_INDEX}) WHERE topic = {{topic}}) AS topic_messages")
#: Messages still waiting or running (a dead one stays in the table, and is not live).
LIVE_SELECT = (f"(SELECT id FROM {MESSAGE_TABLE} FORCE INDEX (PRIMARY) "
               "WHERE status <> 'dead') AS live")
REPLAYED_SELECT = (f"(SELECT id, replayed_from FROM {ATTEMPT_TABLE} FORCE INDEX (PRIMARY) "
                   "WHERE replayed_from IS NOT NULL) AS replayed")


def datetime_literal(value: dt.datetime) -> str:
    """A UTC DATETIME(6) literal for a statement Spark sends (digits only: no escaping)."""
    return f"'{naive_utc(value):%Y-%m-%d %H:%M:%S.%f}'"


def text_literal(value: str) -> str:
    """A utf8mb4 string literal for a statement Spark sends: hex digits, no escaping."""
    return f"CONVERT(X'{value.encode().hex()}' USING utf8mb4)"


def topic_select(topic: str) -> str:
    return TOPIC_SELECT.format(topic=text_literal(topic))


def window_where(since: dt.datetime, until: dt.datetime) -> str:
    return f"finished_at >= {datetime_literal(since)} AND finished_at < {datetime_literal(until)}"


def older_where(before: dt.datetime) -> str:
    return f"finished_at < {datetime_literal(before)}"


def dead_where(before: dt.datetime) -> str:
    return f"status = 'dead' AND run_at < {datetime_literal(before)} AND gate_key IS NULL"


def _row(sql: str, params: list[Any], alias: str | None) -> tuple[object, ...]:
    with connection_for(alias).cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return tuple(row)


def window_bounds(since: dt.datetime, until: dt.datetime,
                  alias: str | None = None) -> tuple[int, int] | None:
    """``(first id, last id)`` of the history finished in ``[since, until)``, or None."""
    low, high = _row(WINDOW_BOUNDS_SQL, [naive_utc(since), naive_utc(until)], alias)
    return None if low is None else (int(str(low)), int(str(high)))


def older_bounds(before: dt.datetime,
                 alias: str | None = None) -> tuple[int, int, int] | None:
    """``(first id, last id, rows)`` of the history finished before ``before``, or None."""
    low, high, count = _row(OLDER_BOUNDS_SQL, [naive_utc(before)], alias)
    return None if low is None else (int(str(low)), int(str(high)), int(str(count)))


def dead_bounds(before: dt.datetime,
                alias: str | None = None) -> tuple[int, int, int] | None:
    """``(first id, last id, rows)`` of the dead messages that died before ``before``."""
    low, high, count = _row(DEAD_BOUNDS_SQL, [naive_utc(before)], alias)
    return None if low is None else (int(str(low)), int(str(high)), int(str(count)))


def replayed_bounds(alias: str | None = None) -> tuple[int, int] | None:
    """``(first id, last id)`` of the history rows that link a replay to its original."""
    low, high = _row(REPLAYED_BOUNDS_SQL, [], alias)
    return None if low is None else (int(str(low)), int(str(high)))


def message_bounds(alias: str | None = None) -> tuple[int, int] | None:
    """``(first id, last id)`` of the message table, or None when it is empty."""
    low, high = _row(MESSAGE_BOUNDS_SQL, [], alias)
    return None if low is None else (int(str(low)), int(str(high)))
