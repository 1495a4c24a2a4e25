"""Leases and recovery: claims of vanished workers go back to the queue.

A lost message goes back to ``ready`` keeping its gate's slot (an ordered subject's head
runs again before anything after it); one that dies on recovery frees its slot like any
death, unless it is a head that holds its subject.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from ..conf import get_settings
from ..models import Outcome
from ..signals import messages_recovered
from . import leader, park, subjects
from .base import (
    CLEAR_CLAIM,
    MESSAGE_TABLE,
    RUNNABLE_STATUS,
    connection_for,
    default_alias,
    in_transaction,
    is_lock_wait,
    logger,
    micros,
    require_autocommit,
    rows_table,
    send_robust,
    with_lock_retry,
)
from .history import HISTORY_FROM_MESSAGE_SQL
from .lockwait import bounded_lock_waits
from .session import SERVER_START_SLACK, connection_session

#: The largest value of ``losses`` (SMALLINT UNSIGNED): counting never adds past it.
LOSSES_MAX = 65535

#: Per database: the lost claims whose last sweep skipped them (a row another session
#: holds), so a lock that lasts is reported once, not at every sweep.
_skipped: dict[str, set[int]] = {}
_skipped_lock = threading.Lock()

#: Claims under a worker's id that it no longer knows about (see ``release_strays``).
RELEASE_STRAYS_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = {RUNNABLE_STATUS}, attempts = IF(attempts > 0, attempts - 1, 0),
       {CLEAR_CLAIM}
 WHERE worker_id = %s AND status = 'claimed' {{keep}}
"""

#: The lease renewal, by (id, token) pairs joined on the primary key in id order: the same
#: order an ack batch locks its rows in, so the two never deadlock (by token they did).
RENEW_SQL = f"""
UPDATE {{pairs}} AS o STRAIGHT_JOIN {MESSAGE_TABLE} AS m
    ON m.id = o.id AND m.claim_token = o.token
   SET m.lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
       m.owner_connection = IF(%s, CONNECTION_ID(), NULL), m.owner_server_start = %s
 WHERE m.status = 'claimed'
"""

CLAIMED_ROWS_SQL = f"""
SELECT id, claim_token, owner_connection, owner_server_start,
       lease_expires_at < UTC_TIMESTAMP(6) AS expired, queue, gate_key, gate_mode,
       lease_expires_at
  FROM {MESSAGE_TABLE}
 WHERE status = 'claimed'
"""

#: A lost claim back to the queue. Only a message that had started spends its attempt
#: (and goes dead when that was its last: run_at then records the death, as in
#: settle.DEAD_SQL); one still waiting in its worker gets the attempt back. Either way it
#: counts one more loss, so it runs alone next time. Assignments are applied left to
#: right: ``attempts`` and ``started_at`` change last.
RECOVER_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = IF(started_at IS NOT NULL AND attempts >= max_attempts, 'dead',
                   {RUNNABLE_STATUS}),
       dedup_key = IF(started_at IS NOT NULL AND attempts >= max_attempts, NULL, dedup_key),
       run_at = IF(started_at IS NOT NULL AND attempts >= max_attempts, UTC_TIMESTAMP(6),
                   run_at),
       attempts = IF(started_at IS NULL AND attempts > 0, attempts - 1, attempts),
       losses = IF(losses < {LOSSES_MAX}, losses + 1, losses),
       last_error = %s, started_at = NULL, {CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""
#: Locks a lost claim and says what its recovery will do with it; nothing when its owner
#: renewed it since the sweep judged it lost (a reconnected worker re-stamps its claims with
#: its new connection and a new lease: the verdict was about the old ones).
LOCK_LOST_SQL = f"""
SELECT started_at IS NOT NULL, attempts >= max_attempts
  FROM {MESSAGE_TABLE}
 WHERE id = %s AND claim_token = %s
   AND owner_connection <=> %s AND lease_expires_at <=> %s
   FOR UPDATE
"""
#: The same for a claim already locked and judged under that lock (an operator's release).
LOCKED_FATE_SQL = f"""
SELECT started_at IS NOT NULL, attempts >= max_attempts
  FROM {MESSAGE_TABLE}
 WHERE id = %s AND claim_token = %s
   FOR UPDATE
"""
#: Note added to the trace of a lost message that had not started.
NOT_STARTED = "it had not started, so the attempt is not counted"
LIVE_CONNECTIONS_SQL = "SELECT ID FROM information_schema.PROCESSLIST"
#: Which of these (id, token) pairs are still claimed by that token.
CLAIMS_HELD_SQL = f"""
SELECT m.id, m.claim_token FROM {{pairs}} AS o STRAIGHT_JOIN {MESSAGE_TABLE} AS m
    ON m.id = o.id AND m.claim_token = o.token
 WHERE m.status = 'claimed'
"""


def renew_leases(pairs: Sequence[tuple[int, str]], lease_seconds: float,
                 alias: str | None = None) -> int:
    """Extend the claims this worker still holds and re-stamp their owner; return how many
    of ``pairs`` (id, token) were still claimed: fewer means a peer took some.

    Only the claims the worker knows: one it lost track of expires and is recovered.
    Re-stamping matters after a reconnect: the claims then belong to the new connection,
    so peers don't mistake a live worker for a dead one.
    """
    if not pairs:
        return 0
    alias = alias or default_alias()
    session = connection_session(alias)
    table, params = rows_table(("id", "token"), sorted(pairs))

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(RENEW_SQL.format(pairs=table),
                           [*params, micros(lease_seconds), session.stamps_owner,
                            session.owner_start])
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)


def claims_held(pairs: Sequence[tuple[int, str]],
                alias: str | None = None) -> set[tuple[int, str]]:
    """The (id, token) pairs among ``pairs`` that are still claimed under that token."""
    if not pairs:
        return set()
    table, params = rows_table(("id", "token"), pairs)
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(CLAIMS_HELD_SQL.format(pairs=table), params)
        return {(int(row[0]), str(row[1])) for row in cursor.fetchall()}


def release_strays(worker_id: str, keep: Sequence[str] = (), alias: str | None = None) -> int:
    """Give back claims under this worker's id except those with the ``keep`` tokens.

    A stopping worker calls this last, so nothing it claimed but never ran stays behind.
    """
    alias = alias or default_alias()
    condition = ("AND claim_token NOT IN (" + ", ".join(["%s"] * len(keep)) + ")") if keep \
        else ""
    sql = RELEASE_STRAYS_SQL.format(keep=condition)

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(sql, [worker_id, *keep])
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)


LostClaim = tuple[int, str, str, subjects.GateRef | None, str | None, Any, Any]


class Recovered(list[int]):
    """What ``recover`` returns: the ids it recovered (a list, as before), and in ``dead``
    those it buried: lost during their last attempt, recovery left them dead."""

    def __init__(self, ids: Sequence[int] = (), dead: Sequence[int] = ()) -> None:
        super().__init__(ids)
        self.dead: list[int] = list(dead)


def _lost_claims(cursor: Any, liveness: str, server_start: int) -> list[LostClaim]:
    """``(id, token, reason, gate, gate_mode, owner, lease)`` of claims whose owner is gone
    or whose lease ran out; ``owner`` and ``lease`` as read, the verdict's grounds."""
    # Read the claims before the process list: a claim visible now was made by a
    # connection that exists now or died; one made later can't be judged wrongly.
    cursor.execute(CLAIMED_ROWS_SQL)
    rows = cursor.fetchall()
    if not rows:
        return []
    live: set[int] = set()
    if liveness == "connection":
        cursor.execute(LIVE_CONNECTIONS_SQL)
        live = {int(row[0]) for row in cursor.fetchall()}
    lost: list[LostClaim] = []
    for (message_id, token, owner, owner_start, expired, queue, gate_key, gate_mode,
         lease) in rows:
        reason = loss_reason(owner, owner_start, expired, live, liveness, server_start)
        if reason is not None:
            lost.append((int(message_id), str(token), reason,
                         subjects.GateRef.of(str(queue), gate_mode, gate_key), gate_mode,
                         owner, lease))
    return lost


def loss_reason(owner: int | None, owner_start: int | None, expired: bool, live: set[int],
                 liveness: str, server_start: int) -> str | None:
    """Why a claim is lost (its owner can't be running it any more), or None if it is not."""
    if expired:
        return "lease expired without a heartbeat"
    if liveness != "connection":
        return None
    if owner_start is not None and owner_start < server_start - SERVER_START_SLACK:
        return "claimed before the database server restarted"
    if owner is not None and int(owner) not in live:
        return f"owner connection {owner} is gone"
    return None


def recover(liveness: str | None = None, alias: str | None = None, *,
            keep_lock: bool = False) -> Recovered:
    """Give the claims of vanished workers back to the queue; return the recovered ids,
    with those this call left dead in ``.dead`` (a ``Recovered``, which is a list).

    Only one sweeper runs at a time (``GET_LOCK``, or on a Galera cluster a lease row:
    ``leader``); others return at once. With ``keep_lock`` the lock stays held by this
    connection, which becomes the one sweeper until it disconnects (on a cluster: until
    it stops renewing the lease with its sweeps). Workers do this: peers then only retry
    the lock now and then, and an idle cluster stays quiet. Each lost attempt gets a ``lost``
    history row, or ``failed`` when it was the message's last attempt (a message that
    keeps killing its workers ends up dead, not in a loop).
    """
    alias = alias or default_alias()
    require_autocommit(alias, "recover()")
    session = connection_session(alias)
    # Behind a proxy the process list and the server start are a backend's, on a cluster
    # a node's: lease only.
    liveness = session.liveness(liveness or get_settings().LIVENESS)
    server_start = session.server_start
    with connection_for(alias).cursor() as cursor:
        lead = leader.take(alias, cursor, session, keep=keep_lock)
        if lead is None:
            return Recovered()
        try:
            lost = _lost_claims(cursor, liveness, server_start)
            recovered, dead = _recover_all(alias, lost)
        finally:
            leader.end(cursor, lead)
    ids = [message_id for message_id, *_ in recovered]
    if ids:
        logger.warning("Recovered %d message(s) from vanished workers: %s", len(ids),
                       "; ".join(f"#{m} ({reason})" for m, _, reason, *_ in recovered))
        send_robust(messages_recovered, None, message_ids=ids)
        park.wake_for(ids, alias)
    return Recovered(ids, dead)


def _recover_all(alias: str, lost: list[LostClaim]) -> tuple[list[LostClaim], list[int]]:
    """Recover each lost claim in a transaction of its own; return those recovered, and
    the ids of those among them that went dead.

    Each waits at most ``UPKEEP_LOCK_WAIT_SECONDS`` for its gate and its row: one that
    another session holds (a producer's transaction left open after enqueuing to the same
    key) is skipped for this sweep. Waiting for it, retried, then failing, stopped the
    sweep of every other lost claim and the leader's claims, at every round.
    """
    recovered: list[LostClaim] = []
    dead: list[int] = []
    skipped: list[int] = []
    held: set[subjects.GateRef] = set()  # gates found held: their others skip without a wait
    if lost:
        with bounded_lock_waits(get_settings().UPKEEP_LOCK_WAIT_SECONDS, alias):
            for claim in lost:
                gate = claim[3]
                try:
                    if gate in held:
                        raise GateHeld(gate)
                    outcome = _recover_one(alias, *claim)
                    if outcome is not None:
                        recovered.append(claim)
                    if outcome == Outcome.FAILED:
                        dead.append(claim[0])
                except GateHeld as exc:
                    held.add(exc.gate)
                    skipped.append(claim[0])
                except DatabaseError as exc:
                    if not is_lock_wait(exc):
                        raise
                    skipped.append(claim[0])
    _report_skipped(alias, skipped)
    return recovered, dead


def _report_skipped(alias: str, skipped: list[int]) -> None:
    """Warn about lost claims skipped for a lock, once for as long as it lasts."""
    with _skipped_lock:
        news = sorted(set(skipped) - _skipped.get(alias, set()))
        _skipped[alias] = set(skipped)
    if news:
        logger.warning(
            "Recovery skipped lost message(s) %s: another transaction holds the message's "
            "row or its gate's (waited %d s). The other lost messages were recovered; these "
            "are tried again at every sweep. If this lasts, find the transaction holding "
            "them (information_schema.INNODB_TRX: a producer's transaction left open after "
            "enqueuing to the same key, a SELECT … FOR UPDATE left open) and end it.",
            ", ".join(f"#{message_id}" for message_id in news),
            get_settings().UPKEEP_LOCK_WAIT_SECONDS)


def _recover_one(alias: str, message_id: int, token: str, reason: str,
                 gate: subjects.GateRef | None, gate_mode: str | None,
                 owner: Any, lease: Any) -> str | None:
    """Recover one lost claim if it still stands as the sweep read it (``owner``, ``lease``)
    and return the attempt's outcome (``failed``: now dead); None when it was acked,
    released or renewed meanwhile."""
    # The gate first (its lock comes before the message's on every path), in case the
    # message dies here and frees its slot.
    frees = gate is not None and subjects.frees_when_dead(gate_mode)
    promoted: list[tuple[int, str]] = []

    def body(cursor: Any) -> str | None:
        gates = _lock_gate(cursor, gate) if frees and gate else {}
        cursor.execute(LOCK_LOST_SQL, [message_id, token, owner, lease])
        row = cursor.fetchone()
        if row is None:
            return None  # acked, released or renewed meanwhile
        started, last_attempt = bool(row[0]), bool(row[1])
        outcome = Outcome.FAILED if started and last_attempt else Outcome.LOST
        note = reason if started else f"{reason}; {NOT_STARTED}"
        cursor.execute(HISTORY_FROM_MESSAGE_SQL,
                       [outcome, "WorkerLost", note, outcome == Outcome.FAILED, message_id])
        cursor.execute(RECOVER_SQL, [f"WorkerLost: {note}", message_id, token])
        if frees and gate is not None and outcome == Outcome.FAILED:
            promoted[:] = subjects.release(cursor, {gate: 1}, gates)
        return str(outcome)

    recovered = in_transaction(alias, body)
    subjects.wake_promoted(alias, promoted)
    return recovered


class GateHeld(Exception):
    """Another session holds the gate a lost claim's recovery must lock first."""

    def __init__(self, gate: subjects.GateRef) -> None:
        super().__init__(gate.id)
        self.gate = gate


def _lock_gate(cursor: Any, gate: subjects.GateRef) -> dict[subjects.GateRef,
                                                            subjects.GateRow]:
    try:
        return subjects.lock_or_create(cursor, [gate], {})
    except DatabaseError as exc:
        if is_lock_wait(exc):
            raise GateHeld(gate) from exc
        raise


def live_connections(cursor: Any, liveness: str) -> set[int]:
    if liveness != "connection":
        return set()
    cursor.execute(LIVE_CONNECTIONS_SQL)
    return {int(row[0]) for row in cursor.fetchall()}

