"""The end of an attempt: ack (delete + history), retry, dead, or release unstarted."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from ..conf import get_settings
from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import Outcome
from .base import (
    CHECK_FAILED,
    CLEAR_CLAIM,
    CONNECTION_LOST,
    MESSAGE_TABLE,
    PACKET_TOO_LARGE,
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
)
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
   SET status = IF(%s > 0, 'scheduled', 'ready'),
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
   SET status = 'ready', attempts = IF(attempts > 0, attempts - 1, 0), {CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""


def ack(message: ClaimedMessage, runner: Runner, result: AttemptResult) -> bool:
    """Delete a finished message and record its success, in one transaction.

    Returns False when the claim had been lost (a peer recovered the message while it
    ran): the history row is still written, and the message stays queued for its re-run.
    """
    return message.id in ack_many([(message, runner, result)])


def ack_many(finished: Sequence[tuple[ClaimedMessage, Runner, AttemptResult]]) -> set[int]:
    """Ack many finished messages in one transaction; return the ids that were still ours.

    One ``DELETE`` of the batch's (id, token) pairs per ``ACK_DELETE_CHUNK`` messages and
    a few multi-row history INSERTs: batching acks is where burn-down throughput comes
    from. Matching pairs, a message this worker re-claimed under a new token is never taken
    for the old claim's; when some claims were lost, the batch is done again the careful
    way, locking first to learn which rows are still ours. The INSERTs are cut to fit the
    server's ``max_allowed_packet``; a row too big for it alone loses its result, then its
    payload copy. A statement the server still refuses as too large (1153, or a dropped
    connection after a big one) is split further and retried, and a result its JSON check
    refuses (4025) is dropped: the ack itself is never lost to them.
    """
    if not finished:
        return set()
    alias = default_alias()
    rows = [attempt_params(message, Outcome.SUCCEEDED, runner, result, True)
            for message, runner, result in finished]
    messages = [message for message, _, _ in finished]
    attempt = _AckAttempt(alias, messages, rows)
    while True:
        try:
            owned = in_transaction(alias, attempt.run)
            break
        except _ClaimsLost:
            attempt.careful = True
        except DatabaseError as exc:  # 4025 arrives as an IntegrityError, 1153 operational
            if not attempt.recoverable(exc):
                raise
    # A message not in ``owned`` runs again: the worker's attempt line says so.
    return owned


class _AckAttempt:
    """One ack batch's statements, and how a refusal of them is answered before a retry."""

    def __init__(self, alias: str, messages: list[ClaimedMessage], rows: list[list[Any]]):
        self.alias = alias
        self.messages = messages
        self.rows = rows
        self.divisor = 1
        self.in_flight = 0  # bytes of the statement being sent
        self.results_dropped = False
        #: Some claims were found lost: lock first to learn which rows are still ours.
        self.careful = False

    def run(self, cursor: Any) -> set[int]:
        self.in_flight = 0
        owned = _delete_acked(cursor, self.messages, self.careful)
        room = row_room(self.alias) // self.divisor
        sizes = [fit_row(message, params, room)
                 for message, params in zip(self.messages, self.rows, strict=True)]
        indexes = list(range(len(self.rows)))
        for part in split_by_size(indexes, sizes, statement_room(self.alias) // self.divisor,
                                  ACK_INSERT_CHUNK):
            self.in_flight = sum(sizes[index] for index in part)
            cursor.execute(ATTEMPT_INSERT_HEAD + ", ".join([ATTEMPT_ROW] * len(part)),
                           [value for index in part for value in self.rows[index]])
        return owned

    def recoverable(self, exc: DatabaseError) -> bool:
        """Whether a change to the rows can get past ``exc``; if so, make it."""
        code = error_code(exc)
        if code == CHECK_FAILED and not self.results_dropped:
            self.results_dropped = True
            had_results = any(params[RESULT_PARAM] is not None for params in self.rows)
            for message, params in zip(self.messages, self.rows, strict=True):
                drop_result(message, params, "its JSON check failed")
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
        cursor.execute(DELETE_PAIRS_SQL.format(pairs=pairs), params)
        if cursor.rowcount != len(part):
            raise _ClaimsLost
        owned.update(message.id for message in part)
    return owned


def ack_within(message: ClaimedMessage, runner: Runner, result: AttemptResult) -> bool:
    """Ack inside the caller's open transaction (for work that commits with its ack)."""
    alias = default_alias()
    params = attempt_params(message, Outcome.SUCCEEDED, runner, result, True)
    fit_row(message, params, row_room(alias))
    with connection_for(alias).cursor() as cursor:
        cursor.execute(ACK_DELETE_SQL, [message.id, message.claim_token])
        owned = bool(cursor.rowcount)
        cursor.execute(INSERT_ATTEMPT_SQL, params)
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

    def body(cursor: Any) -> bool:
        if will_retry:
            cursor.execute(RETRY_SQL, [delay, micros(delay), summary, message.id,
                                       message.claim_token])
        else:
            cursor.execute(DEAD_SQL, [summary, message.id, message.claim_token])
        if not cursor.rowcount:
            return False
        fit_row(message, params, row_room(alias))
        cursor.execute(INSERT_ATTEMPT_SQL, params)
        return True

    if not in_transaction(alias, body):
        return str(Outcome.LOST)  # the worker's attempt line says so
    return str(outcome)


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

    def body(cursor: Any) -> Deferral:
        cursor.execute(LOCK_DEFERRALS_SQL, [message.id, message.claim_token])
        row = cursor.fetchone()
        if row is None:
            return Deferral(str(Outcome.LOST))
        done = int(row[0])
        if done >= limit:
            cursor.execute(DEAD_SQL, [summary, message.id, message.claim_token])
            cursor.execute(INSERT_ATTEMPT_SQL,
                           attempt_params(message, Outcome.FAILED, runner, result, True))
            return Deferral(str(Outcome.FAILED), done)
        delay = defer_delay(done)
        cursor.execute(DEFER_SQL, [micros(delay), summary, message.id, message.claim_token])
        cursor.execute(INSERT_ATTEMPT_SQL,
                       attempt_params(message, Outcome.DEFERRED, runner, result, False))
        return Deferral(str(Outcome.DEFERRED), done + 1, delay)

    return in_transaction(alias, body)


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


def bury(alias: str, message_id: int, token: str, reason: str) -> bool:
    """Make a claimed row that can't be run (a tampered value) dead, with ``reason``.

    The history row is copied on the server from the message row itself, so nothing of it
    has to be read into Python first. Returns False if the claim was lost meanwhile.
    """
    logger.error("Message #%s can't be run: %s. It is now dead.", message_id, reason)

    def body(cursor: Any) -> bool:
        cursor.execute(LOCK_CLAIM_SQL, [message_id, token])
        if cursor.fetchone() is None:
            return False
        # History first: it copies the claim's columns, which DEAD_SQL clears.
        cursor.execute(HISTORY_FROM_MESSAGE_SQL, [Outcome.FAILED, UNRUNNABLE, reason, True,
                                                  message_id])
        cursor.execute(DEAD_SQL, [f"{UNRUNNABLE}: {reason}", message_id, token])
        return True

    return in_transaction(alias, body)


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
            cursor.execute(MARK_STARTED_SQL.format(starts=table), params)
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)
