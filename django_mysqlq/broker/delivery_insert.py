"""The pump's INSERT of a group's deliveries, the first few already claimed by the member
that pumps them (``deliveries.pump_claiming``): the same rows a claim would leave, read
back from the INSERT's ``RETURNING`` instead of by a claim's token.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from ..messages import ClaimedMessage, NewMessage
from .base import MESSAGE_TABLE, connection_for, micros
from .enqueue import insert_rows
from .literals import execute_escaped
from .packets import split_by_size, statement_room
from .session import connection_session

#: The pump's INSERT of deliveries of which the first few are claimed by the pumping
#: member (MariaDB: ``RETURNING``): ``_READY_ROW`` (the gate's status: NULL holds its
#: slot and is ready, else 'blocked') or ``_CLAIMED_ROW`` (what a claim sets).
_DELIVERY_COLUMNS = (
    "queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, gate_key, "
    "gate_mode, gate_limit, enqueued_at, run_at, status, attempts, last_error, claim_token, "
    "owner_connection, owner_server_start, worker_id, claimed_at, lease_expires_at"
)
_READY_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), "
    "COALESCE(%s, 'ready'), 0, '', NULL, NULL, NULL, NULL, NULL, NULL)"
)
_CLAIMED_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), "
    "'claimed', 1, '', %s, IF(%s, CONNECTION_ID(), NULL), %s, %s, UTC_TIMESTAMP(6), "
    "UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)"
)
#: The id, and for a claimed delivery what its claim's read-back would give besides what
#: the pump already has (so the pump needs no read-back).
DELIVERY_INSERT_SQL = (f"INSERT INTO {MESSAGE_TABLE} ({_DELIVERY_COLUMNS}) VALUES {{rows}} "
                       "RETURNING id, enqueued_at, owner_connection")
#: Rows per delivery INSERT (the pump's batch is at most TOPIC_PUMP_BATCH anyway).
DELIVERY_INSERT_CHUNK = 1000


@dataclasses.dataclass(frozen=True)
class PumpClaim:
    """A member's room to run deliveries now: the pump may claim up to ``count`` of the
    deliveries it makes for ``worker_id`` (see ``deliveries.pump_claiming``)."""

    count: int
    worker_id: str
    lease_seconds: float


def insert_deliveries(alias: str, messages: Sequence[NewMessage], sizes: Sequence[int],
                      statuses: Sequence[str | None], claim: PumpClaim | None,
                      token: str) -> tuple[list[int], list[ClaimedMessage]]:
    """Insert the deliveries, the first ``claim.count`` that hold their key's slot as
    claimed under ``token``; return the ids and the claimed ones as a claim's read-back
    would give them (it would read back exactly what this inserted). ``sizes``: each
    row's bytes as sent (``oversized.fitting`` measured them)."""
    if claim is None:
        return insert_rows(alias, messages, statuses, sizes), []
    session = connection_session(alias)
    stamp = [token, session.stamps_owner, session.owner_start, claim.worker_id,
             micros(claim.lease_seconds)]
    rows: list[tuple[str, list[Any]]] = []
    claimed_rows: list[int] = []
    for index, (message, status) in enumerate(zip(messages, statuses, strict=True)):
        params: list[Any] = [
            message.queue, message.task_name, message.payload, message.priority,
            message.max_attempts, message.retry_backoff, message.timeout, message.gate_key,
            message.gate_mode, message.gate_limit]
        if status is None and len(claimed_rows) < claim.count:
            rows.append((_CLAIMED_ROW, [*params, *stamp]))
            claimed_rows.append(index)
        else:
            rows.append((_READY_ROW, [*params, status]))
    returned: list[Sequence[Any]] = []
    with connection_for(alias).cursor() as cursor:
        for chunk in split_by_size(rows, sizes, statement_room(alias), DELIVERY_INSERT_CHUNK):
            execute_escaped(cursor, DELIVERY_INSERT_SQL.format(
                rows=", ".join(r for r, _ in chunk)), [p for _, params in chunk for p in params])
            returned.extend(cursor.fetchall())
    taken = [claimed_message(messages[index], returned[index], token) for index in claimed_rows]
    return [int(row[0]) for row in returned], taken


def claimed_message(message: NewMessage, returned: Sequence[Any], token: str) -> ClaimedMessage:
    """A delivery the pump inserted claimed, as ``read_claimed_messages`` would read it."""
    enqueued_at = returned[1]
    if enqueued_at.tzinfo is None:
        enqueued_at = enqueued_at.replace(tzinfo=dt.UTC)
    return ClaimedMessage(
        id=int(returned[0]), queue=message.queue, task_name=message.task_name,
        payload=message.payload, priority=message.priority, attempt=1,
        max_attempts=message.max_attempts, retry_backoff=float(message.retry_backoff),
        timeout=None if message.timeout is None else float(message.timeout),
        enqueued_at=enqueued_at, claim_token=token,
        connection_id=None if returned[2] is None else int(returned[2]),
        gate_key=message.gate_key, gate_mode=message.gate_mode)
