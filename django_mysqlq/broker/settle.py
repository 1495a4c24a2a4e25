"""The end of an attempt: ack (delete + history), retry, dead, or release unstarted."""

from __future__ import annotations

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
    with_lock_retry,
)
from .history import (
    ATTEMPT_INSERT_HEAD,
    ATTEMPT_ROW,
    INSERT_ATTEMPT_SQL,
    RESULT_PARAM,
    attempt_params,
    drop_result,
    fit_row,
)
from .packets import row_room, split_by_size, statement_room

#: One acked message: matched by its id *and its own* token, so a stale ack never deletes
#: the message re-claimed under another token. OR-ed pairs are point ranges on the
#: primary key or on (claim_token, id); ``(id, claim_token) IN ((…))`` scanned the table
#: for a single pair (MariaDB 10.11).
ACK_PAIR = "(id = %s AND claim_token = %s)"
ACK_DELETE_HEAD = f"DELETE FROM {MESSAGE_TABLE} WHERE "
ACK_DELETE_SQL = ACK_DELETE_HEAD + ACK_PAIR
ACK_RETURNING = " RETURNING id"
#: Pairs per DELETE: given thousands, the optimizer may prefer a scan (5,000 pairs of a
#: 20,000-row table were read that way).
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

DEAD_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'dead', last_error = %s, dedup_key = NULL, {CLEAR_CLAIM}
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


def ack_delete_sql(count: int) -> str:
    """The ack's ``DELETE … RETURNING`` for ``count`` (id, token) pairs (MariaDB)."""
    return ACK_DELETE_HEAD + " OR ".join([ACK_PAIR] * count) + ACK_RETURNING


def ack_many(finished: Sequence[tuple[ClaimedMessage, Runner, AttemptResult]]) -> set[int]:
    """Ack many finished messages in one transaction; return the ids that were still ours.

    One ``DELETE … RETURNING`` (MariaDB) per ``ACK_DELETE_CHUNK`` messages and a few
    multi-row history INSERTs: batching acks is where burn-down throughput comes from.
    The INSERTs are cut to fit the server's ``max_allowed_packet``; a row too big for it
    alone loses its result, then its payload copy. A statement the server still refuses as too large
    (1153, or a dropped connection after a big one) is split further and retried, and a
    result its JSON check refuses (4025) is dropped: the ack itself is never lost to them.
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
        except DatabaseError as exc:  # 4025 arrives as an IntegrityError, 1153 operational
            if not attempt.recoverable(exc):
                raise
    for message in messages:
        if message.id not in owned:
            logger.warning("%s #%s finished after its claim was recovered by a peer; it will "
                           "run again (at-least-once).", message.task_name, message.id)
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

    def run(self, cursor: Any) -> set[int]:
        self.in_flight = 0
        owned = _delete_acked(self.alias, cursor, self.messages)
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


def _delete_acked(alias: str, cursor: Any, messages: Sequence[ClaimedMessage]) -> set[int]:
    """Delete the messages still claimed under their own tokens; return their ids."""
    owned: set[int] = set()
    if connection_for(alias).mysql_is_mariadb:  # type: ignore[attr-defined]
        for start in range(0, len(messages), ACK_DELETE_CHUNK):
            part = messages[start:start + ACK_DELETE_CHUNK]
            cursor.execute(ack_delete_sql(len(part)),
                           [value for m in part for value in (m.id, m.claim_token)])
            owned.update(int(row[0]) for row in cursor.fetchall())
    else:  # MySQL: no DELETE … RETURNING, so one statement per message
        for message in messages:
            cursor.execute(ACK_DELETE_SQL, [message.id, message.claim_token])
            if cursor.rowcount:
                owned.add(message.id)
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
         *, retry: bool = True) -> str:
    """Record a failed attempt; schedule a retry or, out of attempts, make it dead.

    Returns the outcome written (``retried`` or ``failed``), or ``lost`` when a peer had
    recovered the message meanwhile: then nothing is written (the recovery already
    recorded this attempt as lost) and the message is left to its new owner.
    """
    alias = default_alias()
    will_retry = retry and message.attempt < message.max_attempts
    outcome = Outcome.RETRIED if will_retry else Outcome.FAILED
    summary = f"{result.error_class}: {result.error_message}".strip(": ")
    delay = retry_delay(message) if will_retry else 0.0
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
        logger.warning("%s #%s failed after its claim was recovered by a peer; its new "
                       "owner decides what happens next.", message.task_name, message.id)
        return str(Outcome.LOST)
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

