"""History rows: the one place that turns an attempt into a ``mysqlq_attempt`` row."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ..conf import get_settings
from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import Outcome
from .base import ATTEMPT_TABLE, MESSAGE_TABLE, logger, naive_utc, placeholders
from .packets import MEASURE_FROM, SCALAR_BYTES, escaped_size

# Copies a message row into history; the caller adds the worker's columns.
HISTORY_FROM_MESSAGE_SQL = f"""
INSERT INTO {ATTEMPT_TABLE}
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload)
SELECT id, queue, task_name, attempts, %s, priority, enqueued_at, claimed_at,
       UTC_TIMESTAMP(6), COALESCE(worker_id, ''), '', NULL, owner_connection, '', %s, %s, '',
       NULL, IF(%s, payload, '')
  FROM {MESSAGE_TABLE}
 WHERE id = %s
"""

ATTEMPT_INSERT_HEAD = f"""
INSERT INTO {ATTEMPT_TABLE}
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload)
VALUES """
ATTEMPT_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
INSERT_ATTEMPT_SQL = ATTEMPT_INSERT_HEAD + ATTEMPT_ROW

#: Where attempt_params() puts the two values a history row can do without.
RESULT_PARAM = 16
PAYLOAD_PARAM = 17
#: ... and what tells one attempt's row from another's of the same message.
ATTEMPT_PARAM, STARTED_PARAM, WORKER_PARAM = 3, 7, 8

#: Succeeded rows of these messages, and whether each message's row is gone (a plain read).
SUCCEEDED_BEFORE_SQL = f"""
SELECT a.message_id, a.attempt, a.started_at, a.worker_id, m.id IS NULL
  FROM {ATTEMPT_TABLE} AS a LEFT JOIN {MESSAGE_TABLE} AS m ON m.id = a.message_id
 WHERE a.message_id IN ({{ids}}) AND a.outcome = 'succeeded'
"""

#: attempt_params() gives ROW_VALUES values; these are text, the others numbers or times.
ROW_VALUES = 18
TEXT_PARAMS = (1, 2, 4, 8, 9, 12, 13, 14, 15, 16, 17)
#: Bytes of a history row that don't depend on its text: the template and the scalars.
FIXED_ROW_BYTES = (ROW_VALUES - len(TEXT_PARAMS)) * SCALAR_BYTES + len(ATTEMPT_ROW) + 2

#: The deepest nesting MariaDB's ``JSON_VALID`` accepts: 32 levels fail the ``result``
#: column's CHECK (error 4025). MySQL accepts 100; one limit keeps results portable.
MAX_JSON_DEPTH = 31
#: How deep a log line counts a result that is too deep.
DEPTH_REPORTED = 1000
_CONTAINERS = (dict, list, tuple)


def json_depth(value: Any, cap: int) -> int:
    """How many levels deep ``value`` nests lists and dicts, counted up to ``cap``."""
    if not isinstance(value, _CONTAINERS):
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest >= cap:
                return cap
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, _CONTAINERS))
    return deepest


#: The digits of an int at least 1e308, in JSON text: the results worth a closer look.
_LONG_DIGITS = re.compile(r"\d{309}")


def beyond_double(value: Any) -> bool:
    """Whether ``value`` holds an int a double can't hold (past about 1.8e308): MySQL's
    JSON column refuses such a number (error 3140), MariaDB's keeps it as text."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool):
            try:
                float(item)
            except OverflowError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


class ResultOverLimit(ValueError):
    """A JSON result the database would refuse or history can't hold (size, depth, range)."""


def storable_result(value: Any) -> str:
    """The JSON text history stores for ``value``; raises ``TypeError`` / ``ValueError``
    (``ResultOverLimit`` for the database's limits) saying why it can't be stored."""
    text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")  # lone surrogates: the server's JSON_VALID would refuse them
    # Fewer brackets than the limit can't nest past it: most results skip the walk.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH \
            and json_depth(value, MAX_JSON_DEPTH + 1) > MAX_JSON_DEPTH:
        depth = json_depth(value, DEPTH_REPORTED)
        raise ResultOverLimit(
            f"is nested {depth if depth < DEPTH_REPORTED else f'{depth} or more'} levels "
            f"deep, over the {MAX_JSON_DEPTH} the database's JSON check accepts")
    # (A float past a double's range can't be in it: json.dumps refused it above.)
    if _LONG_DIGITS.search(text) is not None and beyond_double(value):
        raise ResultOverLimit("holds an integer too large for a double, which the database's "
                              "JSON column refuses (return it as a string to keep it)")
    limit = get_settings().MAX_PAYLOAD_BYTES
    if len(text) > limit:
        raise ResultOverLimit(f"is {len(text)} characters, over MAX_PAYLOAD_BYTES ({limit})")
    return text


def result_json(message: ClaimedMessage, value: Any) -> str | None:
    """The result as JSON the server accepts, or None (with a warning) if it can't be kept."""
    if value is None:
        return None
    try:
        return storable_result(value)
    except ResultOverLimit as exc:
        logger.warning("Result of %s #%s %s; history keeps no result.", message.task_name,
                       message.id, exc)
    except Exception as exc:  # noqa: BLE001 - any failure (a dict another thread changes,
        # a custom type's own error, MemoryError) loses the result, never the ack
        logger.warning("Result of %s #%s is not storable JSON (%s: %s); history keeps no "
                       "result.", message.task_name, message.id, type(exc).__name__,
                       str(exc)[:200])
    return None


def attempt_params(message: ClaimedMessage, outcome: str, runner: Runner,
                    result: AttemptResult, keep_payload: bool) -> list[Any]:
    return [
        message.id, message.queue, message.task_name, message.attempt, outcome,
        message.priority, naive_utc(message.enqueued_at), naive_utc(result.started_at),
        runner.worker_id, runner.host[:255], runner.pid, message.connection_id,
        runner.thread[:100], result.error_class[:255], result.error_message, result.traceback,
        result_json(message, result.result) if outcome == Outcome.SUCCEEDED else None,
        message.payload if keep_payload else "",
    ]


def succeeded_before(cursor: Any, rows: Sequence[list[Any]]) -> tuple[set[int], set[int]]:
    """Of these success rows (for messages whose claim an ack found gone), the message ids
    whose row is in history already, and of those the ones whose message is gone too.

    An ack retried after a COMMIT whose reply was lost (the connection dropped) finds its
    own work done: the first set must not be written again, the second was acked by it
    (not recovered by a peer: it won't run again)."""
    if not rows:
        return set(), set()
    wanted = {(params[0], params[ATTEMPT_PARAM], params[STARTED_PARAM], params[WORKER_PARAM])
              for params in rows}
    ids = sorted({params[0] for params in rows})
    cursor.execute(SUCCEEDED_BEFORE_SQL.format(ids=placeholders(len(ids))), ids)
    written: set[int] = set()
    acked: set[int] = set()
    for message_id, attempt, started_at, worker_id, message_gone in cursor.fetchall():
        if (int(message_id), int(attempt), started_at, worker_id) in wanted:
            written.add(int(message_id))
            if message_gone:
                acked.add(int(message_id))
    return written, acked


def row_size(params: list[Any]) -> int:
    """Bytes one history row takes in a statement (its values escaped, and its template).

    ``packets.params_size`` over the known layout: it runs once per acked message, so only
    the text values are measured."""
    size = FIXED_ROW_BYTES
    for index in TEXT_PARAMS:
        value = params[index]
        if value.__class__ is str:
            length = len(value)
            size += 4 * length + 2 if length < MEASURE_FROM else escaped_size(value)
        else:
            size += escaped_size(value)
    return size


def fit_row(message: ClaimedMessage, params: list[Any], room: int) -> int:
    """Make a history row fit ``room`` bytes; return its size.

    Too big for a packet even alone, a row first loses its result, then its payload
    copy, each with a warning: the attempt's record and the ack matter more than either.
    """
    size = row_size(params)
    if size > room and params[RESULT_PARAM] is not None:
        params[RESULT_PARAM] = None
        logger.warning("Result of %s #%s is too big for one statement under the server's "
                       "max_allowed_packet; history keeps no result.", message.task_name,
                       message.id)
        size = row_size(params)
    if size > room and params[PAYLOAD_PARAM]:
        params[PAYLOAD_PARAM] = ""
        logger.warning("History row of %s #%s is too big for one statement under the "
                       "server's max_allowed_packet; history keeps no copy of its payload.",
                       message.task_name, message.id)
        size = row_size(params)
    return size


def drop_result(message: ClaimedMessage, params: list[Any], reason: str) -> None:
    """Drop a row's result after the server refused it, with the usual warning."""
    if params[RESULT_PARAM] is not None:
        params[RESULT_PARAM] = None
        logger.warning("Result of %s #%s was refused by the database (%s); history keeps no "
                       "result.", message.task_name, message.id, reason)
