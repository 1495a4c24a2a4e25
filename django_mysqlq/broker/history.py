"""History rows: the one place that turns an attempt into a ``mysqlq_attempt`` row."""

from __future__ import annotations

import json
from typing import Any

from ..conf import get_settings
from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import Outcome
from .base import ATTEMPT_TABLE, MESSAGE_TABLE, logger, naive_utc

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


def result_json(message: ClaimedMessage, value: Any) -> str | None:
    """The result as JSON the server accepts, or None (with a warning) if it can't be kept."""
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # lone surrogates: the server's JSON_VALID would refuse them
    except (TypeError, ValueError, RecursionError) as exc:
        logger.warning("Result of %s #%s is not storable JSON (%s); history keeps no result.",
                       message.task_name, message.id, str(exc)[:200])
        return None
    limit = get_settings().MAX_PAYLOAD_BYTES
    if len(text) > limit:
        logger.warning("Result of %s #%s is %d characters, over MAX_PAYLOAD_BYTES (%d); "
                       "history keeps no result.", message.task_name, message.id, len(text),
                       limit)
        return None
    return text


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

