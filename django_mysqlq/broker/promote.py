"""Scheduled messages whose time has come become ready, in batches along ``run_at``.

A concurrency-limited message waits for its time without a slot of its gate, so when it
is due it passes the gate like a new one: ready if a slot is free, else blocked.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db import DatabaseError

from ..models import GateMode
from . import subjects
from .base import (
    MESSAGE_TABLE,
    RUNNABLE_STATUS,
    connection_for,
    default_alias,
    in_transaction,
    logger,
    placeholders,
)
from .locked import no_wait, run_around_locks

#: Due scheduled messages, but not concurrency-limited ones (see ``promote_limited``).
PROMOTE_SQL = f"""
UPDATE {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
   SET status = {RUNNABLE_STATUS}
 WHERE status = 'scheduled' AND run_at <= UTC_TIMESTAMP(6)
   AND NOT gate_mode <=> '{GateMode.LIMIT}'
 ORDER BY run_at
 LIMIT %s
"""
#: The same rows, stepping over any a stranger has locked (see ``locked``).
DUE_UNLOCKED_SQL = f"""
SELECT id FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
 WHERE status = 'scheduled' AND run_at <= UTC_TIMESTAMP(6)
   AND NOT gate_mode <=> '{GateMode.LIMIT}'
 ORDER BY run_at
 LIMIT %s
   FOR UPDATE SKIP LOCKED
"""
#: Due concurrency-limited messages and their gates (read without locks).
DUE_LIMITED_SQL = f"""
SELECT id, queue, gate_key, gate_limit FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
 WHERE status = 'scheduled' AND run_at <= UTC_TIMESTAMP(6)
   AND gate_mode = '{GateMode.LIMIT}'
 ORDER BY run_at
 LIMIT %s
"""
#: Those of them still due, under their gate's lock, join its blocked messages.
DUE_TO_BLOCKED_SQL = f"""
UPDATE {MESSAGE_TABLE} SET status = 'blocked'
 WHERE id IN ({{ids}}) AND status = 'scheduled' AND run_at <= UTC_TIMESTAMP(6)
   AND gate_mode = '{GateMode.LIMIT}'
"""
PROMOTE_IDS_SQL = f"""
UPDATE {MESSAGE_TABLE} SET status = {RUNNABLE_STATUS}
 WHERE id IN ({{ids}}) AND status = 'scheduled'
"""


def promote_due(limit: int = 1000, alias: str | None = None) -> int:
    """Turn scheduled messages whose time has come into ready ones; return how many."""
    alias = alias or default_alias()
    connection = connection_for(alias)

    def fast() -> int:
        with connection.cursor() as cursor:
            cursor.execute(no_wait(connection, PROMOTE_SQL), [limit])
            return int(cursor.rowcount)

    def body(cursor: Any) -> int:
        cursor.execute(DUE_UNLOCKED_SQL, [limit])
        ids = [int(row[0]) for row in cursor.fetchall()]
        if not ids:
            return 0
        cursor.execute(PROMOTE_IDS_SQL.format(ids=placeholders(len(ids))), ids)
        return int(cursor.rowcount)

    promoted = run_around_locks(alias, (alias, "promotion of due messages"),
                                "Promotion of due messages", fast,
                                lambda: in_transaction(alias, body))
    return promoted + promote_limited(limit, alias)


def promote_limited(limit: int = 1000, alias: str | None = None) -> int:
    """Due concurrency-limited messages pass their gates; return how many were looked at.

    Each gate in its own short transaction, stepping over a gate another transaction holds
    (it is tried again at the next promotion). A due message joins the gate's blocked ones
    and the lowest ids get the free slots: a retry, older than what waits, comes first.
    """
    alias = alias or default_alias()
    with connection_for(alias).cursor() as cursor:
        cursor.execute(DUE_LIMITED_SQL, [limit])
        rows = cursor.fetchall()
    by_gate: dict[subjects.GateRef, list[int]] = defaultdict(list)
    slots: dict[subjects.GateRef, int] = {}
    for message_id, queue, gate_key, gate_limit in rows:
        ref = subjects.GateRef(str(queue), False, str(gate_key))
        by_gate[ref].append(int(message_id))
        slots[ref] = max(1, int(gate_limit or 1))
    moved = 0
    for ref in sorted(by_gate):
        try:
            moved += _pass_gate(alias, ref, by_gate[ref], slots[ref])
        except DatabaseError as exc:
            logger.warning("Promotion of due messages of concurrency key %r (queue %r) "
                           "failed (%s); trying again at the next promotion.", ref.key,
                           ref.queue, exc)
    return moved


def _pass_gate(alias: str, ref: subjects.GateRef, ids: list[int], slots: int) -> int:
    promoted: list[tuple[int, str]] = []

    def body(cursor: Any) -> int:
        rows = subjects.lock(cursor, [ref], skip_locked=True)
        if ref not in rows:
            if ref not in subjects.missing(cursor, [ref]):
                return 0  # another transaction holds the gate: next time
            rows = subjects.lock_or_create(cursor, [ref], {ref: slots})
        cursor.execute(DUE_TO_BLOCKED_SQL.format(ids=placeholders(len(ids))), ids)
        moved = int(cursor.rowcount)
        rows[ref].blocked = max(rows[ref].blocked, 0) + moved
        promoted[:] = subjects.release(cursor, {ref: 0}, rows)
        return moved

    moved = in_transaction(alias, body)
    subjects.wake_promoted(alias, promoted)
    return moved
