"""The end of an attempt: ack (delete + history), retry, dead, or release unstarted.

The ack of a message with ``unique_for`` keeps its dedup key taken for that period, in
the same transaction (``unique``); a message that goes dead frees its key at once.

A message of an ordered subject or a concurrency key frees its gate's slot in the same
transaction as its end (``subjects``), which promotes the next blocked message: it is
ready when the ack commits.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from ..conf import get_settings
from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import GateMode, Outcome
from . import subjects, unique
from .base import (
    CHECK_FAILED,
    CLEAR_CLAIM,
    CONNECTION_LOST,
    INVALID_JSON,
    MESSAGE_TABLE,
    PACKET_TOO_LARGE,
    RUNNABLE_STATUS,
    close_if_broken,
    connection_for,
    default_alias,
    error_code,
    in_transaction,
    logger,
    micros,
    naive_utc,
    rows_table,
    with_lock_retry,
)
from .history import (
    ATTEMPT_INSERT_HEAD,
    ATTEMPT_ROW,
    HISTORY_FROM_MESSAGE_SQL,
    INSERT_ATTEMPT_SQL,
    RESULT_PARAM,
    attempt_params,
    drop_result,
    fit_row,
    succeeded_before,
)
from .literals import execute_escaped
from .packets import row_room, split_by_size, statement_room

#: One message's ack inside a caller's transaction (atomic tasks): a primary-key lookup.
ACK_DELETE_SQL = f"DELETE FROM {MESSAGE_TABLE} WHERE id = %s AND claim_token = %s"
#: An ack matches each message by its id *and its own* token, so a stale ack never deletes
#: the message re-claimed under another token. The (id, claim_token) pairs are a derived
#: table joined to the message table by primary key (eq_ref: one lookup per pair), so
#: these statements read no other row and never wait on one a stranger has locked. A
#: plain ``DELETE … WHERE id IN (…)`` on a small table may scan it all instead, and a
#: DELETE, unlike an UPDATE, waits on every locked row it reads.
DELETE_PAIRS_SQL = f"""
DELETE m FROM {{pairs}} AS o STRAIGHT_JOIN {MESSAGE_TABLE} AS m
    ON m.id = o.id AND m.claim_token = o.token
"""
LOCK_PAIRS_SQL = f"""
SELECT m.id FROM {{pairs}} AS o STRAIGHT_JOIN {MESSAGE_TABLE} AS m
    ON m.id = o.id AND m.claim_token = o.token
   FOR UPDATE
"""


def _pairs(messages: Sequence[ClaimedMessage]) -> tuple[str, list[Any]]:
    return pairs_table([(m.id, m.claim_token) for m in messages])


def pairs_table(pairs: Sequence[tuple[int, str]]) -> tuple[str, list[Any]]:
    """The derived table of (id, token) pairs, and its parameters, in id order: every
    statement on claimed rows locks them in that order, so they never deadlock."""
    return rows_table(("id", "token"), sorted(pairs))


#: When each attempt started, for the rows still claimed by these (id, token) pairs.
MARK_STARTED_SQL = f"""
UPDATE {{starts}} AS o STRAIGHT_JOIN {MESSAGE_TABLE} AS m
    ON m.id = o.id AND m.claim_token = o.token
   SET m.started_at = o.started_at
"""


class _ClaimsLost(Exception):
    """Some of an ack batch's claims were lost: roll back and ack the careful way."""

#: Pairs per DELETE: bounds the statement; past a few thousand rows a derived table costs
#: more to build than the lookups it saves.
ACK_DELETE_CHUNK = 500
#: History rows per INSERT at most (bytes: see packets.py).
ACK_INSERT_CHUNK = 1000
#: A statement past this many bytes that loses its connection may have been too big for
#: a packet limit lower than the one read (a proxy's): it is split and retried, like 1153.
SIZE_SUSPECT_BYTES = 2**20
#: How many times a refused ack is split further (each halves the bytes per statement).
SIZE_RETRIES = 4

RETRY_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = IF(%s > 0, 'scheduled', {RUNNABLE_STATUS}),
       run_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
       last_error = %s, {CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""

#: Locks one claimed row, if it is still this claim's.
LOCK_CLAIM_SQL = f"SELECT 1 FROM {MESSAGE_TABLE} WHERE id = %s AND claim_token = %s FOR UPDATE"

#: A dead message's run_at becomes the time it died: retention ages dead messages by it.
DEAD_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'dead', run_at = UTC_TIMESTAMP(6), last_error = %s, dedup_key = NULL,
       {CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""

RELEASE_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = {RUNNABLE_STATUS}, attempts = IF(attempts > 0, attempts - 1, 0), {CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""


def ack(message: ClaimedMessage, runner: Runner, result: AttemptResult) -> bool:
    """Delete a finished message and record its success, in one transaction.

    Returns False when the claim had been lost (a peer recovered the message while it
    ran): the history row is still written, and the message stays queued for its re-run.
    """
    return message.id in ack_many([(message, runner, result)])


Finished = tuple[ClaimedMessage, Runner, AttemptResult]


def ack_many(finished: Sequence[Finished], busy: list[Finished] | None = None) -> set[int]:
    """Ack many finished messages in one transaction; return the ids that were still ours.

    One ``DELETE`` of the batch's (id, token) pairs per ``ACK_DELETE_CHUNK`` messages and
    a few multi-row history INSERTs: batching acks is where burn-down throughput comes
    from. Matching pairs, a message this worker re-claimed under a new token is never taken
    for the old claim's; when some claims were lost, the batch is done again the careful
    way, locking first to learn which rows are still ours. The INSERTs are cut to fit the
    server's ``max_allowed_packet``; a row too big for it alone loses its result, then its
    payload copy. A statement the server still refuses as too large (1153, or a dropped
    connection after a big one) is split further and retried, and a result its JSON check
    refuses (4025, or MySQL's 3140) is dropped: the ack itself is never lost to them.

    Messages of a gate lock it first, stepping over gates another transaction holds (a
    producer's long transaction must not stall the batch), and so do messages with
    ``unique_for`` for their key's row (a producer enqueuing that key holds it): with
    ``busy`` given, those messages are appended to it, not acked, for the caller to try
    again later; without, they are acked after the batch, waiting for those rows.
    """
    if not finished:
        return set()
    alias = default_alias()
    attempt = _run_ack(alias, finished, wait_for_gates=False)
    owned = attempt.owned
    waiting = [finished[index] for index in attempt.busy]
    if busy is not None:
        busy.extend(waiting)
    elif waiting:
        owned |= _run_ack(alias, waiting, wait_for_gates=True).owned
    return owned


def _run_ack(alias: str, finished: Sequence[Finished], *, wait_for_gates: bool) -> _AckAttempt:
    rows = [attempt_params(message, Outcome.SUCCEEDED, runner, result, True)
            for message, runner, result in finished]
    messages = [message for message, _, _ in finished]
    attempt = _AckAttempt(alias, messages, rows, wait_for_gates)
    while True:
        try:
            owned = in_transaction(alias, attempt.run)
            break
        except _ClaimsLost:
            attempt.careful = True
        except DatabaseError as exc:  # 4025 arrives as an IntegrityError, 1153 operational
            if not attempt.recoverable(exc):
                raise
    attempt.owned = owned
    subjects.wake_promoted(alias, attempt.promoted)
    # A message not in ``owned`` runs again: the worker's attempt line says so.
    return attempt


class _AckAttempt:
    """One ack batch's statements, and how a refusal of them is answered before a retry."""

    def __init__(self, alias: str, messages: list[ClaimedMessage], rows: list[list[Any]],
                 wait_for_gates: bool = True):
        self.alias = alias
        self.messages = messages
        self.rows = rows
        self.divisor = 1
        self.in_flight = 0  # bytes of the statement being sent
        self.results_dropped = False
        #: Some claims were found lost: lock first to learn which rows are still ours.
        self.careful = False
        self.wait_for_gates = wait_for_gates
        #: Indexes of messages left out: another transaction holds their gate.
        self.busy: list[int] = []
        #: Blocked messages this ack gave a slot, as (id, queue).
        self.promoted: list[tuple[int, str]] = []
        self.owned: set[int] = set()

    def run(self, cursor: Any) -> set[int]:
        self.in_flight = 0
        # Keys kept taken after success (``unique_for``): their rows before the gates and
        # the DELETEs (the lock order in ``unique``), and the careful DELETE, which never
        # rolls back rows made here while producers of their keys may wait on them.
        # Without ``wait_for_gates``, a key row another transaction holds (a producer of
        # that key) leaves its message out, like a busy gate.
        busy_keys: set[str | None] = set()
        if self.wait_for_gates:
            keyed = unique.take_rows(cursor, self.messages)
        else:
            keyed, busy_keys = unique.take_free_rows(cursor, self.messages)
        careful = self.careful or keyed > 0
        key_busy = [index for index, message in enumerate(self.messages)
                    if busy_keys and message.unique_for > 0
                    and message.dedup_key in busy_keys]
        gated = {index: ref for index, message in enumerate(self.messages)
                 if message.gate_key is not None and index not in key_busy
                 and (ref := subjects.GateRef.of(message.queue, message.gate_mode,
                                                 message.gate_key)) is not None}
        locked = self._lock_gates(cursor, set(gated.values())) if gated else {}
        self.busy = sorted([*key_busy, *(index for index, ref in gated.items()
                                         if ref not in locked)])
        if self.busy:
            left_out = set(self.busy)
            now = [index for index in range(len(self.messages)) if index not in left_out]
        else:
            now = list(range(len(self.messages)))
        acking = [self.messages[index] for index in now]
        owned = _delete_acked(cursor, acking, careful)
        if keyed:
            unique.remember(cursor, [message for message in acking if message.id in owned])
        written: set[int] = set()
        done: set[int] = set()
        if careful and len(owned) < len(acking):  # a retry after a lost COMMIT reply?
            written, done = succeeded_before(cursor, [
                self.rows[index] for index in now if self.messages[index].id not in owned])
            now = [index for index in now if self.messages[index].id not in written]
        room = row_room(self.alias) // self.divisor
        sizes = [fit_row(message, params, room)
                 for message, params in zip(self.messages, self.rows, strict=True)]
        for part in split_by_size(now, [sizes[index] for index in now],
                                  statement_room(self.alias) // self.divisor,
                                  ACK_INSERT_CHUNK):
            self.in_flight = sum(sizes[index] for index in part)
            execute_escaped(cursor, ATTEMPT_INSERT_HEAD + ", ".join([ATTEMPT_ROW] * len(part)),
                            [value for index in part for value in self.rows[index]])
        freed = Counter(ref for index, ref in gated.items()
                        if ref in locked and self.messages[index].id in owned)
        self.promoted = subjects.release(
            cursor, dict(freed), locked,
            snapshot_may_lag=connection_for(self.alias).in_atomic_block) if freed else []
        # (Messages ``done`` by an earlier try of this ack freed their gates then.)
        return owned | done

    def _lock_gates(self, cursor: Any, refs: set[subjects.GateRef]
                    ) -> dict[subjects.GateRef, subjects.GateRow]:
        """Lock the batch's gates; without ``wait_for_gates``, step over those another
        transaction holds (a gate that is gone is made again, so its messages move on)."""
        if self.wait_for_gates:
            return subjects.lock_or_create(cursor, refs, {})
        locked = subjects.lock(cursor, refs, skip_locked=True)
        absent = refs - set(locked)
        gone = subjects.missing(cursor, absent) if absent else set()
        if gone:
            locked.update(subjects.lock_or_create(cursor, gone, {}))
        return locked

    def recoverable(self, exc: DatabaseError) -> bool:
        """Whether a change to the rows can get past ``exc``; if so, make it."""
        code = error_code(exc)
        if code in (CHECK_FAILED, INVALID_JSON) and not self.results_dropped:
            self.results_dropped = True
            had_results = any(params[RESULT_PARAM] is not None for params in self.rows)
            why = "its JSON check failed" if code == CHECK_FAILED else "not valid JSON to it"
            for message, params in zip(self.messages, self.rows, strict=True):
                drop_result(message, params, why)
            return had_results
        too_large = code == PACKET_TOO_LARGE or (
            code in CONNECTION_LOST and self.in_flight > SIZE_SUSPECT_BYTES)
        if not too_large or self.divisor >= 2**SIZE_RETRIES:
            return False
        logger.warning("An ack of %d message(s) was refused as too large for one statement "
                       "(%s); splitting it further and retrying.", len(self.messages), exc)
        close_if_broken(self.alias)
        self.divisor *= 2
        return True


def _delete_acked(cursor: Any, messages: Sequence[ClaimedMessage], careful: bool) -> set[int]:
    """Delete the messages still claimed under their own tokens; return their ids.

    The fast way deletes every pair at once and raises ``_ClaimsLost`` (the transaction
    is then rolled back) if any was not there; the careful way locks first, to know which.
    """
    owned: set[int] = set()
    for start in range(0, len(messages), ACK_DELETE_CHUNK):
        part = messages[start:start + ACK_DELETE_CHUNK]
        pairs, params = _pairs(part)
        if careful:
            cursor.execute(LOCK_PAIRS_SQL.format(pairs=pairs), params)
            found = {int(row[0]) for row in cursor.fetchall()}
            if found:
                cursor.execute(DELETE_PAIRS_SQL.format(pairs=pairs), params)
            owned |= found
            continue
        execute_escaped(cursor, DELETE_PAIRS_SQL.format(pairs=pairs), params)
        if cursor.rowcount != len(part):
            raise _ClaimsLost
        owned.update(message.id for message in part)
    return owned


def ack_within(message: ClaimedMessage, runner: Runner, result: AttemptResult) -> bool:
    """Ack inside the caller's open transaction (for work that commits with its ack)."""
    alias = default_alias()
    params = attempt_params(message, Outcome.SUCCEEDED, runner, result, True)
    fit_row(message, params, row_room(alias))
    ref = subjects.GateRef.of(message.queue, message.gate_mode, message.gate_key)
    with connection_for(alias).cursor() as cursor:
        unique.take_rows(cursor, [message])  # the key's row first (see ``unique``)
        gates = subjects.lock_or_create(cursor, [ref], {}) if ref is not None else {}
        cursor.execute(ACK_DELETE_SQL, [message.id, message.claim_token])
        owned = bool(cursor.rowcount)
        if owned:
            unique.remember(cursor, [message])
        cursor.execute(INSERT_ATTEMPT_SQL, params)
        if ref is not None and owned:
            # The task's own transaction may read an older snapshot (REPEATABLE READ).
            subjects.wake_promoted(alias, subjects.release(cursor, {ref: 1}, gates,
                                                           snapshot_may_lag=True))
    return owned


def retry_delay(message: ClaimedMessage) -> float:
    """Exponential backoff with jitter: base * 2^(attempt-1), +/-25 %, then capped."""
    base = message.retry_backoff
    if base <= 0:
        return 0.0
    exponent = min(message.attempt - 1, 64)  # 2**64 s is past any cap; no float overflow
    delay = base * 2.0**exponent * random.uniform(0.75, 1.25)
    return float(min(get_settings().RETRY_BACKOFF_MAX, delay))


def fail(message: ClaimedMessage, runner: Runner, result: AttemptResult,
         *, retry: bool = True, retry_in: float | None = None) -> str:
    """Record a failed attempt; schedule a retry or, out of attempts, make it dead.

    ``retry=False`` makes it dead at once; ``retry_in`` is the retry's delay in seconds
    (the task's backoff schedule, or what it asked for), else the exponential backoff.

    Returns the outcome written (``retried`` or ``failed``), or ``lost`` when a peer had
    recovered the message meanwhile: then nothing is written (the recovery already
    recorded this attempt as lost) and the message is left to its new owner.
    """
    alias = default_alias()
    will_retry = retry and message.attempt < message.max_attempts
    outcome = Outcome.RETRIED if will_retry else Outcome.FAILED
    summary = f"{result.error_class}: {result.error_message}".strip(": ")
    delay = (retry_delay(message) if retry_in is None else retry_in) if will_retry else 0.0
    params = attempt_params(message, outcome, runner, result, not will_retry)
    ref = subjects.GateRef.of(message.queue, message.gate_mode, message.gate_key)
    # A concurrency-limited message waits for its retry without its slot (it takes one
    # again when due); an ordered head keeps its subject's slot through its retries.
    frees = ref is not None and (
        (will_retry and delay > 0 and message.gate_mode == GateMode.LIMIT)
        or (not will_retry and subjects.frees_when_dead(message.gate_mode)))
    promoted: list[tuple[int, str]] = []

    def body(cursor: Any) -> bool:
        gates = subjects.lock_or_create(cursor, [ref], {}) if frees and ref else {}
        if will_retry:
            cursor.execute(RETRY_SQL, [delay, micros(delay), summary, message.id,
                                       message.claim_token])
        else:
            cursor.execute(DEAD_SQL, [summary, message.id, message.claim_token])
        if not cursor.rowcount:
            return False
        fit_row(message, params, row_room(alias))
        cursor.execute(INSERT_ATTEMPT_SQL, params)
        if frees and ref is not None:
            promoted[:] = subjects.release(cursor, {ref: 1}, gates)
        return True

    written = in_transaction(alias, body)
    subjects.wake_promoted(alias, promoted)
    if not written:
        return str(Outcome.LOST)  # the worker's attempt line says so
    return str(outcome)


def release(messages: Sequence[ClaimedMessage]) -> int:
    """Give claimed-but-unstarted messages back to the queue, as if never claimed."""
    alias = default_alias()
    released = 0
    for message in messages:
        def run(message: ClaimedMessage = message) -> int:
            with connection_for(alias).cursor() as cursor:
                cursor.execute(RELEASE_SQL, [message.id, message.claim_token])
                return int(cursor.rowcount)

        released += with_lock_retry(alias, run)
    return released



#: Error class recorded for a row that can't be run as it stands (see ``bury``).
UNRUNNABLE = "UnrunnableMessage"


def bury(alias: str, message_id: int, token: str, reason: str,
         gate: subjects.GateRef | None = None, gate_mode: str | None = None) -> bool:
    """Make a claimed row that can't be run (a tampered value) dead, with ``reason``.

    The history row is copied on the server from the message row itself, so nothing of it
    has to be read into Python first. Returns False if the claim was lost meanwhile.
    """
    logger.error("Message #%s can't be run: %s. It is now dead.", message_id, reason)
    frees = gate is not None and subjects.frees_when_dead(gate_mode)
    promoted: list[tuple[int, str]] = []

    def body(cursor: Any) -> bool:
        gates = subjects.lock_or_create(cursor, [gate], {}) if frees and gate else {}
        cursor.execute(LOCK_CLAIM_SQL, [message_id, token])
        if cursor.fetchone() is None:
            return False
        # History first: it copies the claim's columns, which DEAD_SQL clears.
        cursor.execute(HISTORY_FROM_MESSAGE_SQL, [Outcome.FAILED, UNRUNNABLE, reason, True,
                                                  message_id])
        cursor.execute(DEAD_SQL, [f"{UNRUNNABLE}: {reason}", message_id, token])
        if frees and gate is not None:
            promoted[:] = subjects.release(cursor, {gate: 1}, gates)
        return True

    buried = in_transaction(alias, body)
    subjects.wake_promoted(alias, promoted)
    return buried


def mark_started(starts: Sequence[tuple[ClaimedMessage, dt.datetime]],
                 alias: str | None = None) -> int:
    """Record when these claimed messages started running; return how many rows took it.

    Recovery counts a lost attempt only for a message that started: a claimed message
    still waiting in a vanished worker gets its attempt back. The worker records starts
    about once a second (a message that started since is taken for unstarted and runs
    alone next time), and before a message that was lost once starts at all.
    """
    if not starts:
        return 0
    alias = alias or default_alias()
    table, params = rows_table(("id", "token", "started_at"),
                               sorted((m.id, m.claim_token, naive_utc(at)) for m, at in starts))

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            execute_escaped(cursor, MARK_STARTED_SQL.format(starts=table), params)
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)
