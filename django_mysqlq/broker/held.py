"""Held gates: what holds a subject, an operator's release of it, and the repair of gate
counters that disagree with the messages (changed by hand).

A dead head of an ordered subject (``on_dead="hold"``) keeps its slot, so the messages
after it stay ``blocked``. An operator requeues the head (it runs again, first) or
releases the subject: the head stays dead but no longer holds (its mode becomes ``skip``),
and the next message is promoted in the same transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..models import GateMode, MessageStatus, Outcome
from . import subjects
from .base import (
    GATE_TABLE,
    MESSAGE_TABLE,
    connection_for,
    default_alias,
    in_transaction,
    logger,
    micros,
    placeholders,
)
from .operate import OPERATOR_HISTORY_SQL, Operator, requeue

#: Messages of one gate that hold a slot, oldest first, tagged with the gate's place: one
#: arm of a ``UNION ALL`` along mysqlq_msg_gate (holders come before what they block).
HOLDERS_SQL = f"""
(SELECT id, status, %s FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_gate)
  WHERE gate_key = %s AND queue = %s AND {{mode}} AND status <> 'blocked'
    AND (status <> 'dead' OR gate_mode = '{GateMode.HOLD}')
    AND (status <> 'scheduled' OR gate_mode <> '{GateMode.LIMIT}')
  ORDER BY id LIMIT %s)
"""
#: The gates of some messages (read without a lock: a message's gate never changes).
GATES_OF_SQL = f"""
SELECT id, queue, gate_key, gate_mode FROM {MESSAGE_TABLE}
 WHERE id IN ({{ids}}) AND gate_key IS NOT NULL
"""
#: Dead heads that hold their subjects, among some ids, locked (their gates are already).
LOCK_HOLDING_DEAD_SQL = f"""
SELECT id FROM {MESSAGE_TABLE}
 WHERE id IN ({{ids}}) AND status = 'dead' AND gate_mode = '{GateMode.HOLD}'
 ORDER BY id
   FOR UPDATE
"""
#: A released head stays dead, but no longer holds its subject.
SKIP_HEADS_SQL = f"UPDATE {MESSAGE_TABLE} SET gate_mode = '{GateMode.SKIP}' WHERE id IN ({{ids}})"

#: Gates unchanged for a while, oldest first: the ones the repair checks.
STALE_GATES_SQL = f"""
SELECT queue, ordered, gate_key, slots FROM {GATE_TABLE} FORCE INDEX (mysqlq_gate_changed)
 WHERE changed_at < UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND
 ORDER BY changed_at
 LIMIT %s
"""
#: What a gate's counters should be: its blocked messages and its slot holders.
COUNT_GATE_SQL = f"""
SELECT COALESCE(SUM(status = 'blocked'), 0),
       COALESCE(SUM(status IN ('ready', 'claimed')
                    OR (status = 'scheduled' AND gate_mode <> '{GateMode.LIMIT}')
                    OR (status = 'dead' AND gate_mode = '{GateMode.HOLD}')), 0)
  FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_gate)
 WHERE gate_key = %s AND queue = %s AND {{mode}}
"""
#: Gates of the oldest blocked messages whose gate row is gone (deleted by hand).
ORPHANS_SQL = f"""
SELECT DISTINCT b.queue, b.gate_key, b.gate_mode, b.gate_limit
  FROM (SELECT queue, gate_key, gate_mode, gate_limit FROM {MESSAGE_TABLE}
          FORCE INDEX (mysqlq_msg_due)
         WHERE status = 'blocked' AND run_at < UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND
         ORDER BY run_at
         LIMIT %s) AS b
 WHERE NOT EXISTS (SELECT 1 FROM {GATE_TABLE} AS g FORCE INDEX (mysqlq_gate_key)
                    WHERE g.gate_key = b.gate_key AND g.queue = b.queue
                      AND g.ordered = (b.gate_mode <> '{GateMode.LIMIT}'))
"""
#: Gates the repair checks per call, and blocked messages it looks at for lost gates.
REPAIR_BATCH = 50
ORPHAN_SCAN = 500


@dataclasses.dataclass(frozen=True)
class Holder:
    """A message that holds a slot of its gate: ready, claimed, scheduled or dead."""

    id: int
    status: str


def gates_of(ids: Sequence[int]) -> dict[int, subjects.GateRef]:
    """The gate of each of these messages that has one."""
    if not ids:
        return {}
    with connection_for().cursor() as cursor:
        cursor.execute(GATES_OF_SQL.format(ids=placeholders(len(ids))), list(ids))
        return {int(message_id): ref for message_id, queue, key, mode in cursor.fetchall()
                if (ref := subjects.GateRef.of(str(queue), mode, key)) is not None}


def holders(refs: Sequence[subjects.GateRef], per_gate: int = 5
            ) -> dict[subjects.GateRef, list[Holder]]:
    """The messages holding each gate's slots (at most ``per_gate``), oldest first."""
    wanted = sorted(set(refs))
    found: dict[subjects.GateRef, list[Holder]] = {ref: [] for ref in wanted}
    with connection_for().cursor() as cursor:
        for start in range(0, len(wanted), subjects.GATE_CHUNK):
            part = wanted[start:start + subjects.GATE_CHUNK]
            cursor.execute(" UNION ALL ".join(HOLDERS_SQL.replace("{mode}", ref.mode_sql)
                                              for ref in part),
                           [v for n, ref in enumerate(part)
                            for v in (n, ref.key, ref.queue, per_gate)])
            for message_id, status, n in cursor.fetchall():
                found[part[int(n)]].append(Holder(int(message_id), str(status)))
    return found


def dead_heads(ids: Sequence[int]) -> list[int]:
    """The dead heads holding the subjects of these messages (blocked ones, or the heads
    themselves)."""
    refs = sorted(set(gates_of(ids).values()))
    return sorted({h.id for found in holders(refs).values() for h in found
                   if h.status == MessageStatus.DEAD})


def requeue_heads(ids: Sequence[int], operator: Operator) -> list[int]:
    """Requeue the dead heads holding these messages' subjects; return the heads requeued.

    A head keeps its subject's slot: it runs next, then the rest follow.
    """
    return requeue(dead_heads(ids), operator, reset_attempts=True,
                   statuses=(MessageStatus.DEAD,))


def release_subjects(ids: Sequence[int], operator: Operator) -> list[int]:
    """Release the subjects held by the dead heads among ``ids`` (or holding blocked ones
    among them); return the heads released.

    Each head stays dead (requeue it later if it should still run, out of order) and
    records a ``skipped`` history row; the next message of its subject is promoted in the
    same transaction.
    """
    return release_subjects_promoting(ids, operator)[0]


def release_subjects_promoting(ids: Sequence[int],
                               operator: Operator) -> tuple[list[int], list[int]]:
    """:func:`release_subjects`, and the ids of the messages it promoted (made ready: they
    run now); none when no message waited behind the heads."""
    heads = dead_heads(ids)
    refs_by_head = gates_of(heads)
    alias = default_alias()
    released: list[int] = []
    promoted: list[tuple[int, str]] = []
    for ref in sorted(set(refs_by_head.values())):
        mine = sorted(head for head, head_ref in refs_by_head.items() if head_ref == ref)

        def body(cursor: Any, ref: subjects.GateRef = ref, mine: list[int] = mine) -> list[int]:
            gates = subjects.lock_or_create(cursor, [ref], {})
            cursor.execute(LOCK_HOLDING_DEAD_SQL.format(ids=placeholders(len(mine))), mine)
            locked = [int(row[0]) for row in cursor.fetchall()]
            if not locked:
                return []
            cursor.execute(OPERATOR_HISTORY_SQL.format(ids=placeholders(len(locked))),
                           [Outcome.SKIPPED, operator.host[:255], operator.pid,
                            "subject released: its dead head no longer holds it", False,
                            operator.name[:200], *locked])
            cursor.execute(SKIP_HEADS_SQL.format(ids=placeholders(len(locked))), locked)
            promoted.extend(subjects.release(cursor, {ref: len(locked)}, gates))
            return locked

        released.extend(in_transaction(alias, body))
    subjects.wake_promoted(alias, promoted)
    return released, [message_id for message_id, _ in promoted]


@dataclasses.dataclass(frozen=True)
class Repair:
    """A gate whose counters disagreed with its messages, and what they were set to."""

    gate: subjects.GateRef
    active: tuple[int, int]
    blocked: tuple[int, int]

    def describe(self) -> str:
        kind = "subject" if self.gate.ordered else "concurrency key"
        return (f"queue {self.gate.queue!r} {kind} {self.gate.key!r}: active "
                f"{self.active[0]} -> {self.active[1]}, blocked {self.blocked[0]} -> "
                f"{self.blocked[1]}")


def repair_gates(stale_seconds: float, alias: str | None = None) -> list[Repair]:
    """Check gates unchanged for ``stale_seconds``, and the gates of old blocked messages
    whose gate row is gone; recount those that disagree with their messages and promote
    what their free slots allow. Bounded per call; the recovery leader calls it.

    Counters only disagree when a person changed the table by hand: one set too high would
    hold its subject for ever, one gone would strand its blocked messages.
    """
    alias = alias or default_alias()
    with connection_for(alias).cursor() as cursor:
        cursor.execute(STALE_GATES_SQL, [micros(stale_seconds), REPAIR_BATCH])
        stale = [(subjects.GateRef(str(q), bool(o), str(k)), int(s))
                 for q, o, k, s in cursor.fetchall()]
        cursor.execute(ORPHANS_SQL, [micros(stale_seconds), ORPHAN_SCAN])
        lost = [(ref, max(1, int(limit or 1))) for q, k, m, limit in cursor.fetchall()
                if (ref := subjects.GateRef.of(str(q), m, k)) is not None]
    repairs = [r for ref, slots in [*stale, *lost]
               if (r := _recount(alias, ref, slots)) is not None]
    for repair in repairs:
        logger.warning("Gate counters disagreed with their messages (changed by hand?); "
                       "repaired: %s.", repair.describe())
    return repairs


def _recount(alias: str, ref: subjects.GateRef, slots: int) -> Repair | None:
    promoted: list[tuple[int, str]] = []

    def body(cursor: Any) -> Repair | None:
        rows = subjects.lock(cursor, [ref], skip_locked=True)
        if ref not in rows:
            if ref not in subjects.missing(cursor, [ref]):
                return None  # another transaction holds it: next time
            rows = subjects.lock_or_create(cursor, [ref], {ref: slots})
        row = rows[ref]
        cursor.execute(COUNT_GATE_SQL.replace("{mode}", ref.mode_sql), [ref.key, ref.queue])
        blocked, active = (int(value) for value in cursor.fetchone())
        repair = None
        if (row.active, row.blocked) != (active, blocked):
            repair = Repair(ref, (row.active, active), (row.blocked, blocked))
        row.active, row.blocked = active, blocked
        promoted[:] = subjects.release(cursor, {ref: 0}, rows)
        return repair

    repair = in_transaction(alias, body)
    subjects.wake_promoted(alias, promoted)
    return repair
