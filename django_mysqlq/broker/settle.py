"""The end of an attempt: ack (delete + history), retry, dead, or release unstarted."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ..conf import get_settings
from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import Outcome
from .base import (
    CLEAR_CLAIM,
    MESSAGE_TABLE,
    connection_for,
    default_alias,
    in_transaction,
    logger,
    micros,
    with_lock_retry,
)
from .history import ATTEMPT_INSERT_HEAD, ATTEMPT_ROW, INSERT_ATTEMPT_SQL, attempt_params

ACK_DELETE_SQL = f"DELETE FROM {MESSAGE_TABLE} WHERE id = %s AND claim_token = %s"

RETRY_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = IF(%s > 0, 'scheduled', 'ready'),
       run_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
       last_error = %s, {CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""

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

    One ``DELETE … RETURNING`` (MariaDB) and one multi-row history ``INSERT`` whatever
    the batch size: batching acks is where burn-down throughput comes from.
    """
    if not finished:
        return set()
    alias = default_alias()
    mariadb = connection_for(alias).mysql_is_mariadb  # type: ignore[attr-defined]

    def body(cursor: Any) -> set[int]:
        owned: set[int] = set()
        if mariadb:
            ids = [message.id for message, _, _ in finished]
            tokens = sorted({message.claim_token for message, _, _ in finished})
            cursor.execute(
                f"DELETE FROM {MESSAGE_TABLE} WHERE id IN ({', '.join(['%s'] * len(ids))}) "
                f"AND claim_token IN ({', '.join(['%s'] * len(tokens))}) RETURNING id",
                [*ids, *tokens],
            )
            owned = {int(row[0]) for row in cursor.fetchall()}
        else:  # MySQL: no DELETE … RETURNING, so one statement per message
            for message, _, _ in finished:
                cursor.execute(ACK_DELETE_SQL, [message.id, message.claim_token])
                if cursor.rowcount:
                    owned.add(message.id)
        params: list[Any] = []
        for message, runner, result in finished:
            params.extend(attempt_params(message, Outcome.SUCCEEDED, runner, result, True))
        cursor.execute(ATTEMPT_INSERT_HEAD + ", ".join([ATTEMPT_ROW] * len(finished)),
                       params)
        return owned

    owned = in_transaction(alias, body)
    for message, _, _ in finished:
        if message.id not in owned:
            logger.warning("%s #%s finished after its claim was recovered by a peer; it will "
                           "run again (at-least-once).", message.task_name, message.id)
    return owned


def ack_within(message: ClaimedMessage, runner: Runner, result: AttemptResult) -> bool:
    """Ack inside the caller's open transaction (for work that commits with its ack)."""
    alias = default_alias()
    with connection_for(alias).cursor() as cursor:
        cursor.execute(ACK_DELETE_SQL, [message.id, message.claim_token])
        owned = bool(cursor.rowcount)
        cursor.execute(INSERT_ATTEMPT_SQL,
                       attempt_params(message, Outcome.SUCCEEDED, runner, result, True))
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

    def body(cursor: Any) -> bool:
        if will_retry:
            cursor.execute(RETRY_SQL, [delay, micros(delay), summary, message.id,
                                       message.claim_token])
        else:
            cursor.execute(DEAD_SQL, [summary, message.id, message.claim_token])
        if not cursor.rowcount:
            return False
        cursor.execute(INSERT_ATTEMPT_SQL,
                       attempt_params(message, outcome, runner, result, not will_retry))
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

