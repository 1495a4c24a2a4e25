"""Enqueue: insert messages in the caller's transaction, then wake parked workers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from ..messages import NewMessage
from ..signals import message_enqueued
from .base import (
    MESSAGE_TABLE,
    connection_for,
    default_alias,
    logger,
    micros,
    naive_utc,
    send_robust,
)
from .packets import escaped_size, split_by_size, statement_room
from .park import wake

#: Rows per multi-row INSERT in enqueue_many (bytes per statement: see packets.py).
INSERT_CHUNK = 1000
#: Bytes of a row besides its payload and names: the row's template, numbers and times.
INSERT_ROW_BYTES = 400

_INSERT_COLUMNS = (
    "queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, dedup_key, "
    "enqueued_at, run_at, status, attempts, last_error"
)
#: One row of the enqueue INSERT. run_at is the absolute time given, else now + delay, both
#: on the database clock; the row is scheduled when that lies in the future.
_INSERT_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), "
    "COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND), "
    "IF(COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND) > UTC_TIMESTAMP(6), "
    "'scheduled', 'ready'), 0, '')"
)
#: The same row for a message that is ready at once (no run_at, no delay): fewer
#: parameters to escape, which is most of a bulk enqueue's client-side cost.
_INSERT_ROW_NOW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'ready', 0, '')"
)
#: ... and without a dedup key (every row of an enqueue_many()).
_INSERT_ROW_NOW_NO_KEY = (
    "(%s, %s, %s, %s, %s, %s, %s, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'ready', 0, '')"
)
#: The enqueue INSERT of one or more ``{rows}`` (``_INSERT_ROW…`` templates, comma-joined).
INSERT_SQL = f"INSERT INTO {MESSAGE_TABLE} ({_INSERT_COLUMNS}) VALUES {{rows}}"
#: The same, reading the new ids back (MariaDB only: MySQL has no INSERT … RETURNING).
INSERT_RETURNING_SQL = INSERT_SQL + " RETURNING id"
#: The pending message that holds a dedup key (the unique key refused ours).
DEDUP_HOLDER_SQL = f"SELECT id FROM {MESSAGE_TABLE} WHERE dedup_key = %s"



def _ready_now(message: NewMessage) -> bool:
    return message.run_at is None and not message.delay


def _row(message: NewMessage) -> tuple[str, list[Any]]:
    """The VALUES row template for this message and its parameters."""
    params = [
        message.queue, message.task_name, message.payload, message.priority,
        message.max_attempts, message.retry_backoff, message.timeout,
    ]
    if _ready_now(message):
        if message.dedup_key is None:
            return _INSERT_ROW_NOW_NO_KEY, params
        return _INSERT_ROW_NOW, [*params, message.dedup_key]
    params.append(message.dedup_key)
    run_at = naive_utc(message.run_at) if message.run_at is not None else None
    delay_micros = micros(message.delay)
    return _INSERT_ROW, [*params, run_at, delay_micros, run_at, delay_micros]


def _insert_one(alias: str, message: NewMessage) -> int:
    row, params = _row(message)
    with connection_for(alias).cursor() as cursor:
        cursor.execute(INSERT_SQL.format(rows=row), params)
        return int(cursor.lastrowid)


def _insert_many(alias: str, messages: Sequence[NewMessage]) -> list[int]:
    connection = connection_for(alias)
    if not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        # MySQL has no INSERT … RETURNING: insert one by one to learn every id.
        return [_insert_one(alias, message) for message in messages]
    ids: list[int] = []
    with connection.cursor() as cursor:
        for chunk in _chunks(messages, statement_room(alias)):
            params: list[Any] = []
            rows: list[str] = []
            for message in chunk:
                row, row_params = _row(message)
                rows.append(row)
                params.extend(row_params)
            values = ", ".join(rows)
            cursor.execute(INSERT_RETURNING_SQL.format(rows=values), params)
            ids.extend(int(row[0]) for row in cursor.fetchall())
    return ids


def _chunks(messages: Sequence[NewMessage], room: int) -> list[Sequence[NewMessage]]:
    """Split into INSERTs of at most INSERT_CHUNK rows and ``room`` bytes as sent."""
    sizes = [
        escaped_size(message.payload) + INSERT_ROW_BYTES
        + 4 * (len(message.queue) + len(message.task_name) + len(message.dedup_key or ""))
        for message in messages
    ]
    return split_by_size(messages, sizes, room, INSERT_CHUNK)


def _insert_deduplicated(alias: str, message: NewMessage) -> tuple[int, bool]:
    """Insert, or return the id of the pending message that already has this dedup key.

    A dead message gives its key up, so only ready, scheduled or running ones block.
    """
    for attempt in range(3):
        try:
            with transaction.atomic(using=alias):
                return _insert_one(alias, message), True
        except IntegrityError:
            with connection_for(alias).cursor() as cursor:
                cursor.execute(DEDUP_HOLDER_SQL, [message.dedup_key])
                row = cursor.fetchone()
            if row is not None:
                return int(row[0]), False
            if attempt == 2:
                raise
            # The holder finished between our insert and our look-up: insert again.
    raise AssertionError("unreachable")


def enqueue(messages: Sequence[NewMessage]) -> list[int]:
    """Insert messages in the caller's transaction (if any); return their ids in order.

    Times are taken from the database clock. A message whose ``run_at`` lies in the
    future is stored as scheduled and promoted to ready when it is due.
    """
    if not messages:
        return []
    alias = default_alias()
    if len(messages) == 1 and messages[0].dedup_key is not None:
        message_id, inserted = _insert_deduplicated(alias, messages[0])
        ids = [message_id]
        new_ids = ids if inserted else []
    elif len(messages) == 1:
        ids = new_ids = [_insert_one(alias, messages[0])]
    else:
        ids = new_ids = _insert_many(alias, messages)

    task_name = messages[0].task_name
    if new_ids:
        queues = [message.queue for message in messages]  # one per message: wake() counts
        transaction.on_commit(lambda: _after_enqueue(task_name, new_ids, queues), using=alias)
    return ids


def _after_enqueue(task_name: str, ids: list[int], queues: list[str]) -> None:
    try:
        wake(queues)
    except DatabaseError as exc:  # the messages are committed; workers will poll them
        logger.warning("Could not wake idle workers after an enqueue (%s).", exc)
    send_robust(message_enqueued, task_name, message_ids=ids)

