"""Deferral: a message whose task this worker doesn't know goes back for later (deploys)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import GateMode, Outcome
from . import subjects
from .base import CLEAR_CLAIM, MESSAGE_TABLE, default_alias, in_transaction, micros
from .history import INSERT_ATTEMPT_SQL, attempt_params
from .settle import DEAD_SQL

#: A deferral: back to the queue later, the attempt given back, one more deferral counted.
DEFER_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'scheduled', run_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
       attempts = IF(attempts > 0, attempts - 1, 0),
       deferrals = IF(deferrals < 65535, deferrals + 1, deferrals),
       last_error = %s, started_at = NULL, {CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""
LOCK_DEFERRALS_SQL = f"""
SELECT deferrals FROM {MESSAGE_TABLE} WHERE id = %s AND claim_token = %s FOR UPDATE
"""
#: First and longest wait before a deferred message is tried again (it doubles).
DEFER_FIRST_SECONDS = 5.0
DEFER_LONGEST_SECONDS = 300.0


@dataclasses.dataclass(frozen=True)
class Deferral:
    """What ``defer`` did: ``deferred`` (with the delay and the count so far), ``failed``
    (out of deferrals: dead) or ``lost`` (a peer recovered the message meanwhile)."""

    outcome: str
    deferrals: int = 0
    delay: float = 0.0


def defer_delay(deferrals: int) -> float:
    """5 s, 10 s, 20 s … up to 5 minutes: twelve deferrals span about 35 minutes."""
    return min(DEFER_LONGEST_SECONDS, DEFER_FIRST_SECONDS * 2.0 ** min(deferrals, 32))


def defer(message: ClaimedMessage, runner: Runner, result: AttemptResult,
          limit: int) -> Deferral:
    """Give back a message whose task this worker doesn't know, for a later try elsewhere.

    Its attempt is not counted. After ``limit`` deferrals it goes dead with ``result``'s
    error instead, like a failure on its last attempt.
    """
    alias = default_alias()
    summary = f"{result.error_class}: {result.error_message}".strip(": ")
    ref = subjects.GateRef.of(message.queue, message.gate_mode, message.gate_key)
    # Deferred (scheduled for later), a concurrency-limited message gives its slot up;
    # dead, any message but a holding ordered head does.
    may_free = ref is not None and subjects.frees_when_dead(message.gate_mode)
    promoted: list[tuple[int, str]] = []

    def body(cursor: Any) -> Deferral:
        gates = subjects.lock_or_create(cursor, [ref], {}) if may_free and ref else {}
        cursor.execute(LOCK_DEFERRALS_SQL, [message.id, message.claim_token])
        row = cursor.fetchone()
        if row is None:
            return Deferral(str(Outcome.LOST))
        done = int(row[0])
        if done >= limit:
            cursor.execute(DEAD_SQL, [summary, message.id, message.claim_token])
            cursor.execute(INSERT_ATTEMPT_SQL,
                           attempt_params(message, Outcome.FAILED, runner, result, True))
            deferral = Deferral(str(Outcome.FAILED), done)
        else:
            delay = defer_delay(done)
            cursor.execute(DEFER_SQL, [micros(delay), summary, message.id,
                                       message.claim_token])
            cursor.execute(INSERT_ATTEMPT_SQL,
                           attempt_params(message, Outcome.DEFERRED, runner, result, False))
            deferral = Deferral(str(Outcome.DEFERRED), done + 1, delay)
        if ref is not None and gates and (deferral.outcome == Outcome.FAILED
                                          or message.gate_mode == GateMode.LIMIT):
            promoted[:] = subjects.release(cursor, {ref: 1}, gates)
        return deferral

    deferral = in_transaction(alias, body)
    subjects.wake_promoted(alias, promoted)
    return deferral
