"""The claim: one autocommit ``UPDATE … LIMIT`` per queue, read back by its token."""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from ..messages import ClaimedMessage
from ..models import CLAIM_INDEX
from .base import (
    CLEAR_CLAIM,
    MESSAGE_TABLE,
    close_if_broken,
    connection_for,
    default_alias,
    logger,
    micros,
    require_autocommit,
    with_lock_retry,
)
from .session import connection_identity

#: (see claim_sql()): compared under the connection's collation instead, MariaDB no longer
#: sees ``queue`` as fixed and sorts every ready row of the queue (a filesort).
CLAIM_SQL = f"""
UPDATE {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
   SET status = 'claimed', claim_token = %s, owner_connection = CONNECTION_ID(),
       owner_server_start = %s, worker_id = %s, claimed_at = UTC_TIMESTAMP(6),
       lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
       attempts = attempts + 1
 WHERE queue = CONVERT(%s USING utf8mb4){{queue_collation}} AND status = 'ready'
 ORDER BY priority DESC, id
 LIMIT %s
"""

READ_CLAIMED_SQL = f"""
SELECT id, queue, task_name, payload, priority, attempts, max_attempts, retry_backoff,
       timeout, enqueued_at, owner_connection
  FROM {MESSAGE_TABLE}
 WHERE claim_token = %s
 ORDER BY priority DESC, id
"""

RELEASE_TOKEN_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'ready', attempts = IF(attempts > 0, attempts - 1, 0), {CLEAR_CLAIM}
 WHERE claim_token = %s AND status = 'claimed'
"""


QUEUE_COLLATION_SQL = f"""
SELECT COLLATION_NAME FROM information_schema.COLUMNS
 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{MESSAGE_TABLE}' AND COLUMN_NAME = 'queue'
"""
_claim_sql_cache: dict[str, str] = {}


def claim_sql(alias: str | None = None) -> str:
    """The claim statement for this database, with the queue column's own collation.

    Read from the catalog once per process, so it matches whatever collation the
    migration picked on this server.
    """
    alias = alias or default_alias()
    sql = _claim_sql_cache.get(alias)
    if sql is None:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(QUEUE_COLLATION_SQL)
            row = cursor.fetchone()
        sql = _claim_sql_cache[alias] = claim_sql_for(row[0] if row else None)
    return sql


def claim_sql_for(collation: str | None) -> str:
    """The claim statement comparing the queue under ``collation`` (from QUEUE_COLLATION_SQL)."""
    # A catalog value, never user data; checked anyway since it is spliced into SQL.
    ok = collation is not None and collation.replace("_", "").isalnum()
    return CLAIM_SQL.replace("{queue_collation}", f" COLLATE {collation}" if ok else "")


def claim(queues: Sequence[str], limit: int, worker_id: str, lease_seconds: float,
          alias: str | None = None) -> list[ClaimedMessage]:
    """Claim up to ``limit`` ready messages, taking the queues in the order given.

    If a later queue's claim fails, the batches already claimed from earlier queues are
    given back (as if never claimed) before the error is raised: the caller never gets
    them, so they would otherwise wait for their lease to run out and lose an attempt.
    """
    alias = alias or default_alias()
    require_autocommit(alias, "claim()")
    _, server_start = connection_identity(alias)
    claimed: list[ClaimedMessage] = []
    for queue in queues:
        wanted = limit - len(claimed)
        if wanted <= 0:
            break
        token = uuid.uuid4().hex

        def run(queue: str = queue, wanted: int = wanted, token: str = token) -> int:
            with connection_for(alias).cursor() as cursor:
                cursor.execute(claim_sql(alias), [token, server_start, worker_id,
                                           micros(lease_seconds), queue, wanted])
                return int(cursor.rowcount)

        try:
            if with_lock_retry(alias, run) == 0:
                continue
            rows = _read_claimed(alias, token)
        except DatabaseError:
            _give_back(alias, claimed)
            raise
        for row in rows:
            enqueued_at = row[9]
            if timezone.is_naive(enqueued_at):
                enqueued_at = enqueued_at.replace(tzinfo=dt.UTC)
            claimed.append(ClaimedMessage(
                id=int(row[0]), queue=row[1], task_name=row[2], payload=row[3],
                priority=int(row[4]), attempt=int(row[5]), max_attempts=int(row[6]),
                retry_backoff=float(row[7]), timeout=None if row[8] is None else float(row[8]),
                enqueued_at=enqueued_at, claim_token=token, connection_id=int(row[10]),
            ))
    return claimed


def _read_claimed(alias: str, token: str) -> list[Any]:
    """Read a committed claim back; if that fails, give the batch back before raising.

    Without this a read-back cut short (a late wake-up, a dropped connection) would leave
    rows claimed by a worker that never received them.
    """
    def read() -> list[Any]:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(READ_CLAIMED_SQL, [token])
            return list(cursor.fetchall())

    try:
        return with_lock_retry(alias, read)
    except DatabaseError:
        try:
            close_if_broken(alias)
            with_lock_retry(alias, lambda: _release_token(alias, token))
        except DatabaseError:
            logger.warning("A claimed batch (token %s) could not be read back nor released; "
                           "its lease will run out and a peer will recover it.", token)
        raise


def _give_back(alias: str, claimed: Sequence[ClaimedMessage]) -> None:
    """Release batches claimed before a later queue's claim failed: nobody will run them."""
    tokens = sorted({message.claim_token for message in claimed})
    if not tokens:
        return
    try:
        close_if_broken(alias)
        for token in tokens:
            with_lock_retry(alias, functools.partial(_release_token, alias, token))
    except DatabaseError:
        logger.warning("A claim failed part-way and %d message(s) already claimed could not "
                       "be given back; their leases will run out and a peer will recover "
                       "them.", len(claimed))
        return
    logger.warning("A claim failed part-way; %d message(s) already claimed from earlier "
                   "queues were given back.", len(claimed))


def _release_token(alias: str, token: str) -> int:
    with connection_for(alias).cursor() as cursor:
        cursor.execute(RELEASE_TOKEN_SQL, [token])
        return int(cursor.rowcount)

