"""Gates: the slots of ordered subjects and concurrency keys, and who waits for them.

A gate is one ``mysqlq_gate`` row per live (queue, ordered, key). A message of a gate
holds one of its ``slots`` while it is ready, claimed, an ordered head scheduled for its
retry, or a dead head that holds its subject; the rest of the gate's messages wait as
``blocked``, outside the claim index's ready range, so the claim never changes. When a
slot frees (an ack, a death, a cancel) the same transaction promotes the next blocked
messages, lowest id first: they are ready when it commits, with no sweep or poll.

Every function here runs inside a transaction its caller holds, and every path takes
gate rows before message rows (gates in sorted order when it waits for them): with
producers, acks, recovery and operators all doing the same, they can't deadlock on each
other. The counters are read and written only under the gate row's lock.

``acquire``   enqueue: count new messages in, learn how many got a slot
``lock``      lock gates (or step over ones another transaction holds)
``release``   slots freed: promote the next blocked messages, write the counters, drop
              gates left empty
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DatabaseError, transaction

from ..models import GateMode, MessageStatus, gate_id
from .base import GATE_TABLE, MESSAGE_TABLE, logger, rows_table
from .park import wake

#: The enqueue's gate row, created or updated in one statement (it also takes its lock, so
#: producers of one gate queue up here until the first commits, and the ids of a subject's
#: messages follow commit order); a duplicate primary key locks that row alone (see
#: ``models.Gate``). A new gate gives ``LEAST(count, slots)`` of the new messages a slot;
#: an existing one gives none while anything is blocked (nothing may jump the queue), else
#: as many as are free. How many it gave comes back as the cursor's
#: ``lastrowid`` (``LAST_INSERT_ID(1 + taken)``) without another round trip. Assignments
#: run left to right, so ``slots`` below is the new value and ``active``/``blocked`` the
#: old ones; a counter made negative by hand counts as 0.
ACQUIRE_SQL = f"""
INSERT INTO {GATE_TABLE} (id, queue, ordered, gate_key, slots, active, blocked, changed_at)
VALUES (%s, %s, %s, %s, %s, LEAST(%s, %s), %s - LEAST(%s, %s), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
       slots = VALUES(slots),
       active = GREATEST(active, 0) + LAST_INSERT_ID(1 + IF(blocked <> 0 OR active < 0, 0,
                    LEAST(%s, GREATEST(slots - active, 0)))) - 1,
       blocked = GREATEST(blocked, 0) + %s - (LAST_INSERT_ID() - 1),
       changed_at = UTC_TIMESTAMP(6)
"""
#: One gate, locked (``{lock}``: ``FOR UPDATE`` or ``FOR UPDATE SKIP LOCKED``), tagged
#: with its place in the request: one arm of a ``UNION ALL``, a primary-key lookup each.
LOCK_GATE_SQL = f"""
(SELECT id, slots, active, blocked, %s AS n FROM {GATE_TABLE} WHERE id = %s {{lock}})
"""
#: Whether a gate exists (no lock): tells a gate another transaction holds from one gone.
GATE_EXISTS_SQL = f"(SELECT %s FROM {GATE_TABLE} WHERE id = %s)"
#: The next blocked messages of one gate, oldest first, tagged with the gate's place: one
#: arm of a ``UNION ALL``. Walks the gate's entries of mysqlq_msg_gate in id order: the
#: heads come first, so it reads a few rows past them. ``{mode}`` picks the gate's kind
#: (an ordered subject and a concurrency key may share a key string). ``{lock}`` is empty
#: (a plain read: under the gate's lock the latest committed rows can't change) or
#: ``FOR UPDATE`` where a read snapshot may be older than the gate's counters.
NEXT_BLOCKED_SQL = f"""
(SELECT id, queue, %s FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_gate)
  WHERE gate_key = %s AND queue = %s AND status = 'blocked' AND {{mode}}
  ORDER BY id LIMIT %s {{lock}})
"""
ORDERED_MODE_SQL = f"gate_mode IN ('{GateMode.HOLD}', '{GateMode.SKIP}')"
LIMIT_MODE_SQL = f"gate_mode = '{GateMode.LIMIT}'"
#: Blocked messages given a slot: ready, or scheduled if an ordered one is not due yet
#: (a delayed message keeps its place in its subject's order).
PROMOTE_BLOCKED_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = IF(gate_mode <> '{GateMode.LIMIT}' AND run_at > UTC_TIMESTAMP(6),
                   'scheduled', 'ready')
 WHERE id IN ({{ids}}) AND status = 'blocked'
"""
#: New counters of gates locked in this transaction, as (id, active, blocked) rows.
WRITE_COUNTERS_SQL = f"""
UPDATE {{rows}} AS o STRAIGHT_JOIN {GATE_TABLE} AS g ON g.id = o.id
   SET g.active = o.active, g.blocked = o.blocked, g.changed_at = UTC_TIMESTAMP(6)
"""
#: Gates left with nothing active or blocked (locked in this transaction, seen empty).
DROP_GATES_SQL = f"DELETE FROM {GATE_TABLE} WHERE id IN ({{ids}})"

#: Gates per UNION ALL statement.
GATE_CHUNK = 200


@dataclasses.dataclass(frozen=True, order=True)
class GateRef:
    """Which gate: a queue, whether it is an ordered subject, and the key."""

    queue: str
    ordered: bool
    key: str

    @classmethod
    def of(cls, queue: str, mode: str | None, key: str | None) -> GateRef | None:
        """The gate a message with these columns passes, or None."""
        if key is None or mode is None:
            return None
        return cls(queue, mode != GateMode.LIMIT, key)

    @property
    def mode_sql(self) -> str:
        return ORDERED_MODE_SQL if self.ordered else LIMIT_MODE_SQL

    @property
    def id(self) -> str:
        """The gate row's primary key."""
        return gate_id(self.queue, self.ordered, self.key)


@dataclasses.dataclass
class GateRow:
    """A gate as locked in this transaction, with its counters as they now stand."""

    id: str
    ref: GateRef
    slots: int
    active: int
    blocked: int


def acquire(cursor: Any, ref: GateRef, slots: int, count: int) -> int:
    """Count ``count`` new messages into the gate (creating it, locking it); return how many
    of them get a slot (the first ones, in enqueue order); the rest are blocked."""
    cursor.execute(ACQUIRE_SQL, [ref.id, ref.queue, ref.ordered, ref.key, slots, count, slots,
                                 count, count, slots, count, count])
    if cursor.rowcount == 1:  # inserted: a new gate (CLIENT.FOUND_ROWS: 2 for an update)
        return min(count, slots)
    return max(0, int(cursor.lastrowid) - 1)


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), GATE_CHUNK):
        yield items[start:start + GATE_CHUNK]


def lock(cursor: Any, refs: Iterable[GateRef], *, skip_locked: bool) -> dict[GateRef, GateRow]:
    """Lock these gates, in sorted order; return those locked (a missing gate is absent,
    and with ``skip_locked`` so is one another transaction holds: see ``missing``)."""
    ordered = sorted(set(refs))
    found: dict[GateRef, GateRow] = {}
    clause = "FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE"
    for part in _chunks(ordered):
        arm = LOCK_GATE_SQL.replace("{lock}", clause)
        cursor.execute(" UNION ALL ".join([arm] * len(part)),
                       [v for n, r in enumerate(part) for v in (n, r.id)])
        for row_id, slots, active, blocked, n in cursor.fetchall():
            ref = part[int(n)]
            found[ref] = GateRow(str(row_id), ref, int(slots), int(active), int(blocked))
    return found


def missing(cursor: Any, refs: Iterable[GateRef]) -> set[GateRef]:
    """Which of these gates don't exist at all (read without a lock)."""
    wanted = sorted(set(refs))
    present: set[GateRef] = set()
    for part in _chunks(wanted):
        cursor.execute(" UNION ALL ".join([GATE_EXISTS_SQL] * len(part)),
                       [v for n, r in enumerate(part) for v in (n, r.id)])
        present.update(part[int(row[0])] for row in cursor.fetchall())
    return set(wanted) - present


def lock_or_create(cursor: Any, refs: Iterable[GateRef], slots: dict[GateRef, int]
                   ) -> dict[GateRef, GateRow]:
    """Lock these gates, waiting for them; a gate that is gone (deleted by hand) comes back
    empty, with ``slots[ref]`` slots (or 1), so the messages it had find it again."""
    wanted = sorted(set(refs))
    rows = lock(cursor, wanted, skip_locked=False)
    gone = [ref for ref in wanted if ref not in rows]
    for ref in gone:
        acquire(cursor, ref, max(1, slots.get(ref, 1)), 0)
    if gone:
        rows.update(lock(cursor, gone, skip_locked=False))
    return rows


def release(cursor: Any, freed: dict[GateRef, int], rows: dict[GateRef, GateRow],
            *, snapshot_may_lag: bool = False) -> list[tuple[int, str]]:
    """Free ``freed[ref]`` slots of each locked gate, promote as many blocked messages as
    slots are free, and write the counters (a gate left empty is deleted). Returns the
    promoted messages' (id, queue).

    Blocked messages are found with a plain read; under the gate's lock nothing can add or
    move them, so that read is exact at READ COMMITTED. ``snapshot_may_lag``: the caller's
    transaction may read an older snapshot (REPEATABLE READ): a gate whose counter says
    more are blocked than were found is read again with a locking read.
    """
    wants: list[tuple[GateRow, int]] = []
    for ref, count in freed.items():
        row = rows[ref]
        row.active = max(0, max(row.active, 0) - count)
        row.blocked = max(row.blocked, 0)
        wants.append((row, max(0, row.slots - row.active)))
    promoted: list[tuple[int, str]] = []
    looked = [(row, want) for row, want in wants if want > 0]
    found = _next_blocked(cursor, looked, locking=False)
    if snapshot_may_lag:
        again = [(row, want) for row, want in looked
                 if len(found.get(row.ref, [])) < min(want, row.blocked)]
        found.update(_next_blocked(cursor, again, locking=True))
    for row, want in looked:
        ids = found.get(row.ref, [])
        promoted.extend(ids)
        row.active += len(ids)
        # Fewer than asked for: none is left (the plain read is exact under the lock).
        row.blocked = 0 if len(ids) < want else max(0, row.blocked - len(ids))
    if promoted:
        cursor.execute(PROMOTE_BLOCKED_SQL.format(ids=", ".join(["%s"] * len(promoted))),
                       [message_id for message_id, _ in promoted])
    write(cursor, [rows[ref] for ref in freed])
    return promoted


def write(cursor: Any, rows: Sequence[GateRow]) -> None:
    """Write these locked gates' counters; delete those left with nothing in them."""
    empty = sorted(row.id for row in rows if row.active <= 0 and row.blocked <= 0)
    kept = sorted((row.id, row.active, row.blocked) for row in rows
                  if row.active > 0 or row.blocked > 0)
    if kept:
        table, params = rows_table(("id", "active", "blocked"), kept)
        cursor.execute(WRITE_COUNTERS_SQL.format(rows=table), params)
    if empty:
        cursor.execute(DROP_GATES_SQL.format(ids=", ".join(["%s"] * len(empty))), empty)


def _next_blocked(cursor: Any, wants: Sequence[tuple[GateRow, int]], *, locking: bool
                  ) -> dict[GateRef, list[tuple[int, str]]]:
    """Up to ``want`` blocked messages of each gate, oldest first: (id, queue) by gate."""
    found: dict[GateRef, list[tuple[int, str]]] = {}
    clause = "FOR UPDATE" if locking else ""
    for part in _chunks(wants):
        arms = [NEXT_BLOCKED_SQL.replace("{mode}", row.ref.mode_sql).replace("{lock}", clause)
                for row, _ in part]
        cursor.execute(" UNION ALL ".join(arms),
                       [v for n, (row, want) in enumerate(part)
                        for v in (n, row.ref.key, row.ref.queue, want)])
        for message_id, queue, n in cursor.fetchall():
            found.setdefault(part[int(n)][0].ref, []).append((int(message_id), str(queue)))
    for ids in found.values():
        ids.sort()
    return found


def free_one(cursor: Any, ref: GateRef, slots: int,
             *, snapshot_may_lag: bool = False) -> list[tuple[int, str]]:
    """Lock one gate (waiting for it) and free one slot: a single message's death or
    retry. Returns the promoted messages' (id, queue)."""
    rows = lock_or_create(cursor, [ref], {ref: slots})
    return release(cursor, {ref: 1}, rows, snapshot_may_lag=snapshot_may_lag)


def frees_when_dead(mode: str | None) -> bool:
    """Whether a message's death frees its slot (all but an ordered subject's head that
    holds it: ``on_dead="hold"``)."""
    return mode is not None and mode != GateMode.HOLD


def wake_promoted(alias: str, promoted: Sequence[tuple[int, str]]) -> None:
    """Wake parked workers for promoted messages once they are committed.

    Call it after the transaction that promoted them: in autocommit it runs at once, in a
    caller's transaction at its commit.
    """
    if not promoted:
        return
    queues = [queue for _, queue in promoted]

    def run() -> None:
        try:
            wake(queues, alias)
        except DatabaseError as exc:  # committed anyway; workers will find them
            logger.warning("Could not wake idle workers after promoting blocked messages "
                           "(%s).", exc)

    transaction.on_commit(run, using=alias)


def holds_slot(status: str, mode: str | None) -> bool:
    """Whether a message of a gate in this status holds one of its slots."""
    if status in (MessageStatus.READY, MessageStatus.CLAIMED):
        return True
    if status == MessageStatus.SCHEDULED:
        return mode != GateMode.LIMIT  # an ordered head waiting for its retry or its time
    return status == MessageStatus.DEAD and mode == GateMode.HOLD


@dataclasses.dataclass(frozen=True)
class Target:
    """A message an operator action locked: what its gate bookkeeping needs."""

    id: int
    queue: str
    status: str
    gate: GateRef | None
    gate_mode: str | None


#: Requeued messages that found no free slot of their gate wait their turn.
REBLOCK_SQL = f"UPDATE {MESSAGE_TABLE} SET status = 'blocked' WHERE id IN ({{ids}})"


def after_cancel(cursor: Any, targets: Sequence[Target], rows: dict[GateRef, GateRow]
                 ) -> list[tuple[int, str]]:
    """Cancelled (deleted) messages free their slots or their places in line; the next
    blocked ones are promoted. Returns the promoted (id, queue)."""
    freed: dict[GateRef, int] = {}
    for target in targets:
        if target.gate is None:
            continue
        freed.setdefault(target.gate, 0)
        if target.status == MessageStatus.BLOCKED:
            rows[target.gate].blocked = max(rows[target.gate].blocked, 0) - 1
        elif holds_slot(target.status, target.gate_mode):
            freed[target.gate] += 1
    return release(cursor, freed, rows) if freed else []


def after_requeue(cursor: Any, targets: Sequence[Target], rows: dict[GateRef, GateRow]
                  ) -> None:
    """Requeued (made ready) messages that held no slot take a free one, or wait blocked
    when none is free or others wait already; a slot holder keeps its own."""
    touched: dict[GateRef, GateRow] = {}
    reblock: list[int] = []
    for target in sorted(targets, key=lambda t: t.id):
        if target.gate is None or holds_slot(target.status, target.gate_mode):
            continue
        row = touched.setdefault(target.gate, rows[target.gate])
        row.active, row.blocked = max(row.active, 0), max(row.blocked, 0)
        if row.blocked == 0 and row.active < row.slots:
            row.active += 1
        else:
            row.blocked += 1
            reblock.append(target.id)
    if reblock:
        cursor.execute(REBLOCK_SQL.format(ids=", ".join(["%s"] * len(reblock))), reblock)
    write(cursor, list(touched.values()))
