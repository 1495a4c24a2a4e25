"""The claim: one autocommit ``UPDATE … LIMIT`` per queue, read back by its token."""

from __future__ import annotations

import datetime as dt
import functools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from ..messages import ClaimedMessage
from ..models import CLAIM_INDEX
from .base import (
    CLEAR_CLAIM,
    MESSAGE_TABLE,
    RUNNABLE_STATUS,
    close_if_broken,
    connection_for,
    default_alias,
    in_transaction,
    logger,
    micros,
    placeholders,
    require_autocommit,
    with_lock_retry,
)
from .locked import no_wait, run_around_locks
from .session import connection_session
from .settle import bury
from .subjects import GateRef

#: The largest value of ``attempts`` (INT UNSIGNED): the claim never adds past it, so a
#: tampered row can't make the statement fail for the whole queue (it goes dead instead).
ATTEMPTS_MAX = 4294967295

#: What a claim sets on each row it takes (the token, owner and lease parameters first).
_CLAIM_SET = f"""
   SET status = 'claimed', claim_token = %s, owner_connection = IF(%s, CONNECTION_ID(), NULL),
       owner_server_start = %s, worker_id = %s, claimed_at = UTC_TIMESTAMP(6),
       lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, started_at = NULL,
       attempts = IF(attempts < {ATTEMPTS_MAX}, attempts + 1, attempts)"""

#: The claim. ``{queue_collation}`` becomes `` COLLATE <the queue column's collation>``
#: (see claim_sql()): compared under the connection's collation instead, MariaDB no longer
#: sees ``queue`` as fixed and sorts every ready row of the queue (a filesort).
CLAIM_SQL = f"""
UPDATE {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX}){_CLAIM_SET}
 WHERE queue = CONVERT(%s USING utf8mb4){{queue_collation}} AND status = 'ready'
 ORDER BY priority DESC, id
 LIMIT %s
"""
#: The claim's rows, stepping over any a stranger has locked (see ``locked``)...
READY_UNLOCKED_SQL = f"""
SELECT id FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
 WHERE queue = CONVERT(%s USING utf8mb4){{queue_collation}} AND status = 'ready'
 ORDER BY priority DESC, id
 LIMIT %s
   FOR UPDATE SKIP LOCKED
"""
#: A locked row met by the claim: the queue's first committed ready rows (a plain read:
#: a producer's insert not yet committed is not among them)...
READY_COMMITTED_SQL = f"""
SELECT id FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
 WHERE queue = CONVERT(%s USING utf8mb4){{queue_collation}} AND status = 'ready'
 ORDER BY priority DESC, id
 LIMIT %s
"""
#: ... and those of them no other transaction holds (a held one is skipped).
UNHELD_OF_SQL = f"SELECT id FROM {MESSAGE_TABLE} WHERE id IN ({{ids}}) FOR UPDATE SKIP LOCKED"
#: Between the two looks of ``held_ready``: another claim's rows are free in milliseconds.
HELD_LOOK_AGAIN_SECONDS = 0.05
#: ... then claimed by id, in the same transaction.
CLAIM_IDS_SQL = f"""
UPDATE {MESSAGE_TABLE}{_CLAIM_SET}
 WHERE id IN ({{ids}}) AND status = 'ready'
"""

READ_CLAIMED_SQL = f"""
SELECT id, queue, task_name, payload, priority, attempts, max_attempts, retry_backoff,
       timeout, enqueued_at, owner_connection, losses, gate_key, gate_mode, dedup_key,
       unique_for
  FROM {MESSAGE_TABLE}
 WHERE claim_token = %s
 ORDER BY priority DESC, id
"""

RELEASE_TOKEN_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = {RUNNABLE_STATUS}, attempts = IF(attempts > 0, attempts - 1, 0),
       {CLEAR_CLAIM}
 WHERE claim_token = %s AND status = 'claimed'
"""


QUEUE_COLLATION_SQL = f"""
SELECT COLLATION_NAME FROM information_schema.COLUMNS
 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{MESSAGE_TABLE}' AND COLUMN_NAME = 'queue'
"""
_collation_cache: dict[str, str | None] = {}


def _queue_collation(alias: str) -> str | None:
    """The queue column's collation, read from the catalog once per process and database."""
    if alias not in _collation_cache:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(QUEUE_COLLATION_SQL)
            row = cursor.fetchone()
        _collation_cache[alias] = row[0] if row else None
    return _collation_cache[alias]


def with_queue_collation(sql: str, collation: str | None) -> str:
    """``sql`` comparing the queue under ``collation`` (from QUEUE_COLLATION_SQL)."""
    # A catalog value, never user data; checked anyway since it is spliced into SQL.
    ok = collation is not None and collation.replace("_", "").isalnum()
    return sql.replace("{queue_collation}", f" COLLATE {collation}" if ok else "")


def claim_sql(alias: str | None = None) -> str:
    """The claim statement for this database, with the queue column's own collation, so it
    matches whatever collation the migration picked on this server."""
    return with_queue_collation(CLAIM_SQL, _queue_collation(alias or default_alias()))


def claim_sql_for(collation: str | None) -> str:
    """The claim statement comparing the queue under ``collation``."""
    return with_queue_collation(CLAIM_SQL, collation)


def _held_ids(alias: str, queue: str, limit: int, collation: str | None) -> set[int]:
    def body(cursor: Any) -> set[int]:
        cursor.execute(with_queue_collation(READY_COMMITTED_SQL, collation), [queue, limit])
        ids = [int(row[0]) for row in cursor.fetchall()]
        if not ids:
            return set()
        cursor.execute(UNHELD_OF_SQL.format(ids=placeholders(len(ids))), ids)
        return set(ids) - {int(row[0]) for row in cursor.fetchall()}

    return in_transaction(alias, body)


def held_ready(alias: str, queue: str, limit: int, collation: str | None) -> bool:
    """Whether another transaction holds one of the queue's first ``limit`` committed
    ready rows at two looks ``HELD_LOOK_AGAIN_SECONDS`` apart (a claim's rows are held
    for its statement only): what the claim met is then a stranger's lock, not a
    producer's insert still uncommitted (``locked.run_around_locks``)."""
    first = _held_ids(alias, queue, limit, collation)
    if not first:
        return False
    time.sleep(HELD_LOOK_AGAIN_SECONDS)
    return bool(first & _held_ids(alias, queue, limit, collation))


def claim(queues: Sequence[str], limit: int, worker_id: str, lease_seconds: float,
          alias: str | None = None) -> list[ClaimedMessage]:
    """Claim up to ``limit`` ready messages, taking the queues in the order given.

    A row that can't be run as it stands (a tampered value) goes dead with its reason
    instead of being returned.
    If a later queue's claim fails, the batches already claimed from earlier queues are
    given back (as if never claimed) before the error is raised: the caller never gets
    them, so they would otherwise wait for their lease to run out and lose an attempt.
    """
    alias = alias or default_alias()
    require_autocommit(alias, "claim()")
    session = connection_session(alias)  # proxy or cluster: no owner stamp, lease only
    connection = connection_for(alias)
    collation = _queue_collation(alias)
    claimed: list[ClaimedMessage] = []
    for queue in queues:
        wanted = limit - len(claimed)
        if wanted <= 0:
            break
        token = uuid.uuid4().hex
        stamp = [token, session.stamps_owner, session.owner_start, worker_id,
                 micros(lease_seconds)]

        def fast(queue: str = queue, wanted: int = wanted, stamp: list[Any] = stamp) -> int:
            with connection.cursor() as cursor:
                cursor.execute(no_wait(connection, with_queue_collation(CLAIM_SQL, collation)),
                               [*stamp, queue, wanted])
                return int(cursor.rowcount)

        def body(cursor: Any, queue: str = queue, wanted: int = wanted,
                 stamp: list[Any] = stamp) -> int:
            cursor.execute(with_queue_collation(READY_UNLOCKED_SQL, collation), [queue, wanted])
            ids = [int(row[0]) for row in cursor.fetchall()]
            if not ids:
                return 0
            cursor.execute(CLAIM_IDS_SQL.format(ids=placeholders(len(ids))), [*stamp, *ids])
            return int(cursor.rowcount)

        def around(body: Callable[[Any], int] = body) -> int:
            return in_transaction(alias, body)

        before, taken = len(claimed), 0
        try:
            taken = run_around_locks(
                alias, (alias, queue), f"Queue {queue!r}", fast, around,
                functools.partial(held_ready, alias, queue, wanted, collation))
            if not taken:
                continue
            rows = _read_claimed(alias, token)
            for row in rows:
                message = _message(row, token)
                if isinstance(message, ClaimedMessage):
                    claimed.append(message)
                else:
                    gate_key, gate_mode = row[12], row[13]
                    bury(alias, int(row[0]), token, message,
                         GateRef.of(str(row[1]), gate_mode, gate_key), gate_mode)
        except DatabaseError:
            # (This queue's batch too, by its token, once its claim went through: a
            # read-back cut short or a bury that failed left it claimed, held by nobody,
            # until its lease ran out. Nothing to give back when nothing was claimed.)
            tokens = {m.claim_token for m in claimed} | ({token} if taken else set())
            give_back_tokens(alias, sorted(tokens), before + taken, "this claim")
            raise
    return claimed


def read_claimed_messages(alias: str, token: str, count: int,
                          source: str) -> list[ClaimedMessage]:
    """The ``count`` messages claimed under ``token``, read back (rows that can't be run
    go dead); if that fails, they are given back (said as claimed from ``source``) before
    the error is raised."""
    claimed: list[ClaimedMessage] = []
    try:
        for row in _read_claimed(alias, token):
            message = _message(row, token)
            if isinstance(message, ClaimedMessage):
                claimed.append(message)
            else:
                bury(alias, int(row[0]), token, message,
                     GateRef.of(str(row[1]), row[13], row[12]), row[13])
    except DatabaseError:
        give_back_tokens(alias, [token], count, source)
        raise
    return claimed


def _message(row: Sequence[Any], token: str) -> ClaimedMessage | str:
    """The claimed row as a message, or why it can't be run as it stands."""
    try:
        attempt = int(row[5])
        if attempt >= ATTEMPTS_MAX:
            return (f"its attempts counter is at the column's maximum ({ATTEMPTS_MAX}): "
                    "the row was changed by hand; requeue it with its attempts reset")
        enqueued_at = row[9]
        if timezone.is_naive(enqueued_at):
            enqueued_at = enqueued_at.replace(tzinfo=dt.UTC)
        return ClaimedMessage(
            id=int(row[0]), queue=str(row[1]), task_name=str(row[2]), payload=str(row[3]),
            priority=int(row[4]), attempt=attempt, max_attempts=int(row[6]),
            retry_backoff=float(row[7]), timeout=None if row[8] is None else float(row[8]),
            enqueued_at=enqueued_at, claim_token=token,
            connection_id=None if row[10] is None else int(row[10]), losses=int(row[11]),
            gate_key=row[12], gate_mode=row[13], dedup_key=row[14],
            unique_for=int(row[15] or 0),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        return f"the row can't be read ({type(exc).__name__}: {exc}): it was changed by hand"


def _read_claimed(alias: str, token: str) -> list[Any]:
    """Read a committed claim back. If that fails, the caller gives the batch back (with
    the others it claimed, and says how many): a read-back cut short (a dropped
    connection) must not leave rows claimed by a worker that never received them."""
    def read() -> list[Any]:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(READ_CLAIMED_SQL, [token])
            return list(cursor.fetchall())

    return with_lock_retry(alias, read)


def give_back_tokens(alias: str, tokens: Sequence[str], count: int, source: str) -> None:
    """Release the messages claimed under ``tokens`` by a claim that fails part-way (its
    caller never gets them), before the error is raised; ``count``: how many the caller
    knows of (said if the release fails).

    Said at WARNING with the number the release found claimed; nothing when it found none
    (a peer recovered them meanwhile). Callers pass only tokens that hold rows: a claim cut
    short before it claimed anything (a producer's late wake-up, ``KILL QUERY``, ending the
    first statement) has nothing to give back and says nothing.
    """
    if not tokens:
        return
    released = 0
    try:
        close_if_broken(alias)
        for token in tokens:
            released += with_lock_retry(alias, functools.partial(_release_token, alias, token))
    except DatabaseError:
        logger.warning("A claim failed part-way and %d message(s) already claimed could not "
                       "be given back; their leases will run out and a peer will recover "
                       "them.", count)
        return
    if released:
        logger.warning("A claim failed part-way; %d message(s) already claimed from %s were "
                       "given back.", released, source)


def _release_token(alias: str, token: str) -> int:
    with connection_for(alias).cursor() as cursor:
        cursor.execute(RELEASE_TOKEN_SQL, [token])
        return int(cursor.rowcount)

