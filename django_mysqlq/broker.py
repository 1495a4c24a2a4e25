"""Every statement that moves a message: enqueue, claim, ack, fail, release, promote, recover.

Nothing else in the package writes the queue tables. Statements are raw SQL where the
ORM can't say them (``UPDATE … ORDER BY … LIMIT``, ``FORCE INDEX``, ``CONNECTION_ID()``),
always parameterised, and all times come from the database clock (``UTC_TIMESTAMP(6)``)
so that producers and workers on hosts with skewed clocks agree on what is due.

Delivery is at-least-once: a claim is one autocommit ``UPDATE … LIMIT n`` stamped with
the claimer's connection id, the server's start time and a fresh token; the batch is read
back by the token. Ack deletes the message and writes its history row in one transaction,
guarded by the token so a late ack never touches a message a peer has since recovered.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import Signal
from django.utils import timezone

from .conf import get_settings
from .models import ATTEMPT_OUTCOMES, CLAIM_INDEX, OPERABLE_STATUSES, MessageStatus, Outcome
from .signals import message_enqueued, messages_recovered
from .tasks import NewMessage

logger = logging.getLogger("django_mysqlq")

T = TypeVar("T")

MESSAGE_TABLE = "mysqlq_message"
ATTEMPT_TABLE = "mysqlq_attempt"
WORKER_TABLE = "mysqlq_worker"
QUEUE_TABLE = "mysqlq_queue"
#: Named lock held by the one sweeper; scoped to the schema, so databases don't share it.
RECOVERY_LOCK_NAME = "CONCAT('django_mysqlq:recover:', DATABASE())"
RECOVERY_LOCK_SQL = f"SELECT GET_LOCK({RECOVERY_LOCK_NAME}, 0)"
RECOVERY_UNLOCK_SQL = "SELECT RELEASE_LOCK(CONCAT('django_mysqlq:recover:', DATABASE()))"

#: MySQL error codes retried with jitter: deadlock, lock wait timeout.
LOCK_ERRORS = frozenset({1213, 1205})
#: A wake-up's KILL QUERY that hit a statement instead of a SLEEP: retried at once.
QUERY_INTERRUPTED = 1317
LOCK_RETRY_LIMIT = 8
#: Seconds of tolerance when comparing server start times (Uptime has 1 s resolution).
SERVER_START_SLACK = 2
#: Rows per multi-row INSERT in enqueue_many, and payload bytes per statement (well under
#: the default max_allowed_packet of 16 MiB).
INSERT_CHUNK = 1000
INSERT_CHUNK_BYTES = 4 * 2**20

_INSERT_COLUMNS = (
    "queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, dedup_key, "
    "enqueued_at, run_at, status, attempts, last_error"
)
#: One row of the enqueue INSERT. run_at is the absolute time given, else now + delay, both
#: on the database clock; the row is scheduled when that lies in the future.
_INSERT_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), "
    "COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND), "
    "IF(COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND) > UTC_TIMESTAMP(6), "
    "'scheduled', 'ready'), 0, '')"
)
#: The same row for a message that is ready at once (no run_at, no delay): fewer
#: parameters to escape, which is most of a bulk enqueue's client-side cost.
_INSERT_ROW_NOW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'ready', 0, '')"
)
#: ... and without a dedup key (every row of an enqueue_many()).
_INSERT_ROW_NOW_NO_KEY = (
    "(%s, %s, %s, %s, %s, %s, %s, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'ready', 0, '')"
)

#: The claim. ``{queue_collation}`` becomes `` COLLATE <the queue column's collation>``
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

_CLEAR_CLAIM = (
    "claim_token = NULL, owner_connection = NULL, owner_server_start = NULL, "
    "worker_id = NULL, claimed_at = NULL, lease_expires_at = NULL"
)

ACK_DELETE_SQL = f"DELETE FROM {MESSAGE_TABLE} WHERE id = %s AND claim_token = %s"

RETRY_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = IF(%s > 0, 'scheduled', 'ready'),
       run_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
       last_error = %s, {_CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""

DEAD_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'dead', last_error = %s, dedup_key = NULL, {_CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""

RELEASE_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'ready', attempts = IF(attempts > 0, attempts - 1, 0), {_CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""

RELEASE_TOKEN_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'ready', attempts = IF(attempts > 0, attempts - 1, 0), {_CLEAR_CLAIM}
 WHERE claim_token = %s AND status = 'claimed'
"""

#: Claims under a worker's id that it no longer knows about (see ``release_strays``).
RELEASE_STRAYS_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'ready', attempts = IF(attempts > 0, attempts - 1, 0), {_CLEAR_CLAIM}
 WHERE worker_id = %s AND status = 'claimed' {{keep}}
"""

PROMOTE_SQL = f"""
UPDATE {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
   SET status = 'ready'
 WHERE status = 'scheduled' AND run_at <= UTC_TIMESTAMP(6)
 ORDER BY run_at
 LIMIT %s
"""

RENEW_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
       owner_connection = CONNECTION_ID(), owner_server_start = %s
 WHERE claim_token IN ({{tokens}}) AND status = 'claimed'
"""

CLAIMED_ROWS_SQL = f"""
SELECT id, claim_token, owner_connection, owner_server_start,
       lease_expires_at < UTC_TIMESTAMP(6) AS expired
  FROM {MESSAGE_TABLE}
 WHERE status = 'claimed'
"""

RECOVER_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = IF(attempts >= max_attempts, 'dead', 'ready'),
       dedup_key = IF(attempts >= max_attempts, NULL, dedup_key),
       last_error = %s, {_CLEAR_CLAIM}
 WHERE id = %s AND claim_token = %s
"""

# Copies a message row into history; the caller adds the worker's columns.
_HISTORY_FROM_MESSAGE = f"""
INSERT INTO {ATTEMPT_TABLE}
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload)
SELECT id, queue, task_name, attempts, %s, priority, enqueued_at, claimed_at,
       UTC_TIMESTAMP(6), COALESCE(worker_id, ''), '', NULL, owner_connection, '', %s, %s, '',
       NULL, IF(%s, payload, '')
  FROM {MESSAGE_TABLE}
 WHERE id = %s
"""

_ATTEMPT_INSERT_HEAD = f"""
INSERT INTO {ATTEMPT_TABLE}
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload)
VALUES """
_ATTEMPT_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
INSERT_ATTEMPT_SQL = _ATTEMPT_INSERT_HEAD + _ATTEMPT_ROW

IDENTITY_SQL = "SELECT CONNECTION_ID(), UNIX_TIMESTAMP(NOW(6))"
#: Works on MariaDB and MySQL 8 alike (MySQL 8 dropped information_schema.GLOBAL_STATUS).
UPTIME_SQL = "SHOW GLOBAL STATUS LIKE 'Uptime'"
LIVE_CONNECTIONS_SQL = "SELECT ID FROM information_schema.PROCESSLIST"

REGISTER_WORKER_SQL = f"""
INSERT INTO {WORKER_TABLE}
       (id, host, pid, queues, concurrency, connection_id, started_at, last_heartbeat,
        stopped_at, processed, failed)
VALUES (%s, %s, %s, %s, %s, CONNECTION_ID(), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), NULL, 0, 0)
ON DUPLICATE KEY UPDATE last_heartbeat = UTC_TIMESTAMP(6), stopped_at = NULL, listening = 0,
       connection_id = CONNECTION_ID()
"""
HEARTBEAT_WORKER_SQL = f"""
UPDATE {WORKER_TABLE}
   SET last_heartbeat = UTC_TIMESTAMP(6), connection_id = CONNECTION_ID(),
       processed = %s, failed = %s, stopped_at = NULL, listening = %s
 WHERE id = %s
"""
STOP_WORKER_SQL = f"""
UPDATE {WORKER_TABLE}
   SET stopped_at = UTC_TIMESTAMP(6), listening = 0, processed = %s, failed = %s
 WHERE id = %s
"""
MARK_STALE_WORKERS_SQL = f"""
UPDATE {WORKER_TABLE}
   SET stopped_at = last_heartbeat
 WHERE stopped_at IS NULL AND last_heartbeat < UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND
"""


@dataclasses.dataclass(frozen=True)
class ClaimedMessage:
    """A message this worker holds, as read back by its claim token."""

    id: int
    queue: str
    task_name: str
    payload: str
    priority: int
    attempt: int
    max_attempts: int
    retry_backoff: float
    timeout: float | None
    enqueued_at: dt.datetime
    claim_token: str
    connection_id: int


@dataclasses.dataclass(frozen=True)
class Runner:
    """Who ran an attempt: written into its history row."""

    worker_id: str
    host: str
    pid: int
    thread: str


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    """How one attempt ended, as the worker saw it."""

    started_at: dt.datetime
    error_class: str = ""
    error_message: str = ""
    traceback: str = ""
    result: Any = None


class BrokerStats:
    """Counters the worker reports: lock conflicts retried inside the broker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.deadlocks = 0
        self.lock_waits = 0

    def count(self, code: int) -> None:
        with self._lock:
            if code == 1213:
                self.deadlocks += 1
            else:
                self.lock_waits += 1


stats = BrokerStats()


def _alias() -> str:
    return get_settings().DATABASE


def _connection(alias: str | None = None) -> BaseDatabaseWrapper:
    return connections[alias or _alias()]


def _naive_utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _error_code(exc: BaseException) -> int | None:
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None


def was_interrupted(exc: BaseException) -> bool:
    """Whether a statement was cut short by ``KILL QUERY`` (a wake-up that came late)."""
    return isinstance(exc, OperationalError) and _error_code(exc) == QUERY_INTERRUPTED


def _with_lock_retry(alias: str, operation: Callable[[], T]) -> T:
    """Run ``operation``; retry it on deadlock/lock-wait errors with jittered backoff.

    Only valid outside the caller's transaction: inside one, a deadlock has already
    rolled back everything else, so the error must reach the caller.
    """
    connection = _connection(alias)
    for attempt in range(LOCK_RETRY_LIMIT):
        try:
            return operation()
        except OperationalError as exc:
            code = _error_code(exc)
            if (
                code not in LOCK_ERRORS | {QUERY_INTERRUPTED}
                or connection.in_atomic_block
                or attempt == LOCK_RETRY_LIMIT - 1
            ):
                raise
            if code == QUERY_INTERRUPTED:
                continue  # an autocommit statement killed by a late wake-up: harmless
            stats.count(code)
            time.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))
    raise AssertionError("unreachable")


def _require_autocommit(alias: str, what: str) -> None:
    if _connection(alias).in_atomic_block:
        raise RuntimeError(
            f"{what} must run in autocommit mode, outside transaction.atomic(): a claim "
            "held inside an open transaction is invisible to peers and can't be recovered."
        )


# --------------------------------------------------------------------------- identity

_IDENTITY_ATTRIBUTE = "_django_mysqlq_identity"


def connection_identity(alias: str | None = None) -> tuple[int, int]:
    """``(CONNECTION_ID(), server start epoch)`` of this thread's connection.

    Cached on the driver's connection object, so a reconnect (a new object) asks again.
    """
    connection = _connection(alias)
    connection.ensure_connection()
    raw = connection.connection
    cached: tuple[int, int] | None = getattr(raw, _IDENTITY_ATTRIBUTE, None)
    if cached is not None:
        return cached
    with connection.cursor() as cursor:
        cursor.execute(UPTIME_SQL)
        uptime = int(cursor.fetchone()[1])
        sent = time.time()
        cursor.execute(IDENTITY_SQL)
        connection_id, server_now = cursor.fetchone()
        received = time.time()
    identity = (int(connection_id), int(float(server_now)) - uptime)
    setattr(raw, _IDENTITY_ATTRIBUTE, identity)
    global _clock_offset
    _clock_offset = float(server_now) - (sent + received) / 2
    return identity


#: Database clock minus this host's clock, in seconds, measured with each new connection.
_clock_offset = 0.0


def database_now() -> dt.datetime:
    """Now on the database clock (estimated), so history times agree with ``enqueued_at``."""
    return timezone.now() + dt.timedelta(seconds=_clock_offset)


# --------------------------------------------------------------------------- enqueue


def _ready_now(message: NewMessage) -> bool:
    return message.run_at is None and not message.delay


def _row(message: NewMessage) -> tuple[str, list[Any]]:
    """The VALUES row template for this message and its parameters."""
    params = [
        message.queue, message.task_name, message.payload, message.priority,
        message.max_attempts, message.retry_backoff, message.timeout,
    ]
    if _ready_now(message):
        if message.dedup_key is None:
            return _INSERT_ROW_NOW_NO_KEY, params
        return _INSERT_ROW_NOW, [*params, message.dedup_key]
    params.append(message.dedup_key)
    run_at = _naive_utc(message.run_at) if message.run_at is not None else None
    delay_micros = _micros(message.delay)
    return _INSERT_ROW, [*params, run_at, delay_micros, run_at, delay_micros]


def _insert_one(alias: str, message: NewMessage) -> int:
    row, params = _row(message)
    with _connection(alias).cursor() as cursor:
        cursor.execute(f"INSERT INTO {MESSAGE_TABLE} ({_INSERT_COLUMNS}) VALUES {row}", params)
        return int(cursor.lastrowid)


def _insert_many(alias: str, messages: Sequence[NewMessage]) -> list[int]:
    connection = _connection(alias)
    if not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        # MySQL has no INSERT … RETURNING: insert one by one to learn every id.
        return [_insert_one(alias, message) for message in messages]
    ids: list[int] = []
    with connection.cursor() as cursor:
        for chunk in _chunks(messages):
            params: list[Any] = []
            rows: list[str] = []
            for message in chunk:
                row, row_params = _row(message)
                rows.append(row)
                params.extend(row_params)
            values = ", ".join(rows)
            cursor.execute(
                f"INSERT INTO {MESSAGE_TABLE} ({_INSERT_COLUMNS}) VALUES {values} RETURNING id",
                params,
            )
            ids.extend(int(row[0]) for row in cursor.fetchall())
    return ids


def _chunks(messages: Sequence[NewMessage]) -> list[Sequence[NewMessage]]:
    """Split into INSERTs of at most INSERT_CHUNK rows and about INSERT_CHUNK_BYTES."""
    chunks: list[Sequence[NewMessage]] = []
    start = size = 0
    for index, message in enumerate(messages):
        length = len(message.payload) + 200
        if index > start and (index - start >= INSERT_CHUNK or size + length > INSERT_CHUNK_BYTES):
            chunks.append(messages[start:index])
            start, size = index, 0
        size += length
    chunks.append(messages[start:])
    return chunks


def _insert_deduplicated(alias: str, message: NewMessage) -> tuple[int, bool]:
    """Insert, or return the id of the pending message that already has this dedup key.

    A dead message gives its key up, so only ready, scheduled or running ones block.
    """
    for attempt in range(3):
        try:
            with transaction.atomic(using=alias):
                return _insert_one(alias, message), True
        except IntegrityError:
            with _connection(alias).cursor() as cursor:
                cursor.execute(
                    f"SELECT id FROM {MESSAGE_TABLE} WHERE dedup_key = %s", [message.dedup_key]
                )
                row = cursor.fetchone()
            if row is not None:
                return int(row[0]), False
            if attempt == 2:
                raise
            # The holder finished between our insert and our look-up: insert again.
    raise AssertionError("unreachable")


def enqueue(messages: Sequence[NewMessage]) -> list[int]:
    """Insert messages in the caller's transaction (if any); return their ids in order.

    Times are taken from the database clock. A message whose ``run_at`` lies in the
    future is stored as scheduled and promoted to ready when it is due.
    """
    if not messages:
        return []
    alias = _alias()
    if len(messages) == 1 and messages[0].dedup_key is not None:
        message_id, inserted = _insert_deduplicated(alias, messages[0])
        ids = [message_id]
        new_ids = ids if inserted else []
    elif len(messages) == 1:
        ids = new_ids = [_insert_one(alias, messages[0])]
    else:
        ids = new_ids = _insert_many(alias, messages)

    task_name = messages[0].task_name
    if new_ids:
        queues = [message.queue for message in messages]
        transaction.on_commit(lambda: _after_enqueue(task_name, new_ids, queues), using=alias)
    return ids


def _after_enqueue(task_name: str, ids: list[int], queues: list[str]) -> None:
    try:
        wake(queues)
    except DatabaseError as exc:  # the messages are committed; workers will poll them
        logger.warning("Could not wake idle workers after an enqueue (%s).", exc)
    send_robust(message_enqueued, task_name, message_ids=ids)


def send_robust(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send a signal; a failing receiver is logged and never breaks the queue's work."""
    for receiver, response in signal.send_robust(sender=sender, **kwargs):
        if isinstance(response, Exception):
            logger.error("Receiver %r of a django_mysqlq signal failed", receiver,
                         exc_info=response)


# --------------------------------------------------------------------------- claim


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
    alias = alias or _alias()
    sql = _claim_sql_cache.get(alias)
    if sql is None:
        with _connection(alias).cursor() as cursor:
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
    """Claim up to ``limit`` ready messages, taking the queues in the order given."""
    alias = alias or _alias()
    _require_autocommit(alias, "claim()")
    _, server_start = connection_identity(alias)
    claimed: list[ClaimedMessage] = []
    for queue in queues:
        wanted = limit - len(claimed)
        if wanted <= 0:
            break
        token = uuid.uuid4().hex

        def run(queue: str = queue, wanted: int = wanted, token: str = token) -> int:
            with _connection(alias).cursor() as cursor:
                cursor.execute(claim_sql(alias), [token, server_start, worker_id,
                                           _micros(lease_seconds), queue, wanted])
                return int(cursor.rowcount)

        if _with_lock_retry(alias, run) == 0:
            continue
        rows = _read_claimed(alias, token)
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
        with _connection(alias).cursor() as cursor:
            cursor.execute(READ_CLAIMED_SQL, [token])
            return list(cursor.fetchall())

    try:
        return _with_lock_retry(alias, read)
    except DatabaseError:
        try:
            close_if_broken(alias)
            _with_lock_retry(alias, lambda: _release_token(alias, token))
        except DatabaseError:
            logger.warning("A claimed batch (token %s) could not be read back nor released; "
                           "its lease will run out and a peer will recover it.", token)
        raise


def _release_token(alias: str, token: str) -> int:
    with _connection(alias).cursor() as cursor:
        cursor.execute(RELEASE_TOKEN_SQL, [token])
        return int(cursor.rowcount)


# --------------------------------------------------------------------------- finish


def _result_json(message: ClaimedMessage, value: Any) -> str | None:
    """The result as JSON the server accepts, or None (with a warning) if it can't be kept."""
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # lone surrogates: the server's JSON_VALID would refuse them
    except (TypeError, ValueError, RecursionError) as exc:
        logger.warning("Result of %s #%s is not storable JSON (%s); history keeps no result.",
                       message.task_name, message.id, str(exc)[:200])
        return None
    limit = get_settings().MAX_PAYLOAD_BYTES
    if len(text) > limit:
        logger.warning("Result of %s #%s is %d characters, over MAX_PAYLOAD_BYTES (%d); "
                       "history keeps no result.", message.task_name, message.id, len(text),
                       limit)
        return None
    return text


def _attempt_params(message: ClaimedMessage, outcome: str, runner: Runner,
                    result: AttemptResult, keep_payload: bool) -> list[Any]:
    return [
        message.id, message.queue, message.task_name, message.attempt, outcome,
        message.priority, _naive_utc(message.enqueued_at), _naive_utc(result.started_at),
        runner.worker_id, runner.host[:255], runner.pid, message.connection_id,
        runner.thread[:100], result.error_class[:255], result.error_message, result.traceback,
        _result_json(message, result.result) if outcome == Outcome.SUCCEEDED else None,
        message.payload if keep_payload else "",
    ]


def _in_transaction(alias: str, body: Callable[[Any], T]) -> T:
    """Run ``body(cursor)`` in one transaction, retried on deadlocks and lock waits.

    In autocommit (the worker's case) the transaction is an explicit ``START TRANSACTION``
    … ``COMMIT``: Django's ``atomic()`` would add two ``SET autocommit`` round trips,
    a third of an ack batch's statements. Inside a caller's transaction, ``atomic()``
    nests as usual.
    """
    connection = _connection(alias)

    def nested() -> T:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            return body(cursor)

    def explicit() -> T:
        with connection.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            try:
                value = body(cursor)
                cursor.execute("COMMIT")
            except BaseException:
                try:
                    cursor.execute("ROLLBACK")
                except DatabaseError:
                    pass  # the connection is gone, and with it the transaction
                raise
            return value

    if connection.in_atomic_block or not connection.get_autocommit():
        return _with_lock_retry(alias, nested)
    return _with_lock_retry(alias, explicit)


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
    alias = _alias()
    mariadb = _connection(alias).mysql_is_mariadb  # type: ignore[attr-defined]

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
            params.extend(_attempt_params(message, Outcome.SUCCEEDED, runner, result, True))
        cursor.execute(_ATTEMPT_INSERT_HEAD + ", ".join([_ATTEMPT_ROW] * len(finished)),
                       params)
        return owned

    owned = _in_transaction(alias, body)
    for message, _, _ in finished:
        if message.id not in owned:
            logger.warning("%s #%s finished after its claim was recovered by a peer; it will "
                           "run again (at-least-once).", message.task_name, message.id)
    return owned


def ack_within(message: ClaimedMessage, runner: Runner, result: AttemptResult) -> bool:
    """Ack inside the caller's open transaction (for work that commits with its ack)."""
    alias = _alias()
    with _connection(alias).cursor() as cursor:
        cursor.execute(ACK_DELETE_SQL, [message.id, message.claim_token])
        owned = bool(cursor.rowcount)
        cursor.execute(INSERT_ATTEMPT_SQL,
                       _attempt_params(message, Outcome.SUCCEEDED, runner, result, True))
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
    alias = _alias()
    will_retry = retry and message.attempt < message.max_attempts
    outcome = Outcome.RETRIED if will_retry else Outcome.FAILED
    summary = f"{result.error_class}: {result.error_message}".strip(": ")
    delay = retry_delay(message) if will_retry else 0.0

    def body(cursor: Any) -> bool:
        if will_retry:
            cursor.execute(RETRY_SQL, [delay, _micros(delay), summary, message.id,
                                       message.claim_token])
        else:
            cursor.execute(DEAD_SQL, [summary, message.id, message.claim_token])
        if not cursor.rowcount:
            return False
        cursor.execute(INSERT_ATTEMPT_SQL,
                       _attempt_params(message, outcome, runner, result, not will_retry))
        return True

    if not _in_transaction(alias, body):
        logger.warning("%s #%s failed after its claim was recovered by a peer; its new "
                       "owner decides what happens next.", message.task_name, message.id)
        return str(Outcome.LOST)
    return str(outcome)


def release(messages: Sequence[ClaimedMessage]) -> int:
    """Give claimed-but-unstarted messages back to the queue, as if never claimed."""
    alias = _alias()
    released = 0
    for message in messages:
        def run(message: ClaimedMessage = message) -> int:
            with _connection(alias).cursor() as cursor:
                cursor.execute(RELEASE_SQL, [message.id, message.claim_token])
                return int(cursor.rowcount)

        released += _with_lock_retry(alias, run)
    return released


# --------------------------------------------------------------------------- upkeep


def promote_due(limit: int = 1000, alias: str | None = None) -> int:
    """Turn scheduled messages whose time has come into ready ones; return how many."""
    alias = alias or _alias()

    def run() -> int:
        with _connection(alias).cursor() as cursor:
            cursor.execute(PROMOTE_SQL, [limit])
            return int(cursor.rowcount)

    return _with_lock_retry(alias, run)


def renew_leases(tokens: Sequence[str], lease_seconds: float,
                 alias: str | None = None) -> int:
    """Extend the claims this worker still holds (by token) and re-stamp their owner.

    Only the tokens the worker knows: a claim it lost track of expires and is recovered.
    Re-stamping matters after a reconnect: the claims then belong to the new connection,
    so peers don't mistake a live worker for a dead one.
    """
    if not tokens:
        return 0
    alias = alias or _alias()
    _, server_start = connection_identity(alias)
    sql = RENEW_SQL.format(tokens=", ".join(["%s"] * len(tokens)))

    def run() -> int:
        with _connection(alias).cursor() as cursor:
            cursor.execute(sql, [_micros(lease_seconds), server_start, *tokens])
            return int(cursor.rowcount)

    return _with_lock_retry(alias, run)


def release_strays(worker_id: str, keep: Sequence[str] = (), alias: str | None = None) -> int:
    """Give back claims under this worker's id except those with the ``keep`` tokens.

    A stopping worker calls this last, so nothing it claimed but never ran stays behind.
    """
    alias = alias or _alias()
    condition = ("AND claim_token NOT IN (" + ", ".join(["%s"] * len(keep)) + ")") if keep \
        else ""
    sql = RELEASE_STRAYS_SQL.format(keep=condition)

    def run() -> int:
        with _connection(alias).cursor() as cursor:
            cursor.execute(sql, [worker_id, *keep])
            return int(cursor.rowcount)

    return _with_lock_retry(alias, run)


def _lost_claims(cursor: Any, liveness: str, server_start: int) -> list[tuple[int, str, str]]:
    """``(id, token, reason)`` of claims whose owner is gone or whose lease ran out."""
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
    lost = []
    for message_id, token, owner, owner_start, expired in rows:
        reason = _loss_reason(owner, owner_start, expired, live, liveness, server_start)
        if reason is not None:
            lost.append((int(message_id), str(token), reason))
    return lost


def _loss_reason(owner: int | None, owner_start: int | None, expired: bool, live: set[int],
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


_LEADER_ATTRIBUTE = "_django_mysqlq_recovery_leader"


def is_recovery_leader(alias: str | None = None) -> bool:
    """Whether this thread's connection holds the recovery lock for good (see ``recover``)."""
    raw = _connection(alias).connection
    return raw is not None and bool(getattr(raw, _LEADER_ATTRIBUTE, False))


def recover(liveness: str | None = None, alias: str | None = None, *,
            keep_lock: bool = False) -> list[int]:
    """Give the claims of vanished workers back to the queue; return the recovered ids.

    Only one sweeper runs at a time (``GET_LOCK``); others return at once. With
    ``keep_lock`` the lock stays held by this connection, which becomes the one
    sweeper until it disconnects (workers do this: peers then only retry the lock
    now and then, and an idle cluster stays quiet). Each lost attempt gets a ``lost``
    history row, or ``failed`` when it was the message's last attempt (a message that
    keeps killing its workers ends up dead, not in a loop).
    """
    alias = alias or _alias()
    conf = get_settings()
    liveness = liveness or conf.LIVENESS
    _require_autocommit(alias, "recover()")
    _, server_start = connection_identity(alias)
    connection = _connection(alias)
    held = is_recovery_leader(alias)
    with connection.cursor() as cursor:
        if not held:
            cursor.execute(RECOVERY_LOCK_SQL)
            if cursor.fetchone()[0] != 1:
                return []
            if keep_lock:
                setattr(connection.connection, _LEADER_ATTRIBUTE, True)
        try:
            lost = _lost_claims(cursor, liveness, server_start)
            recovered = [m for m in lost if _recover_one(alias, *m)]
        finally:
            if not keep_lock and not held:
                cursor.execute(RECOVERY_UNLOCK_SQL)
                cursor.fetchone()
    ids = [message_id for message_id, _, _ in recovered]
    if ids:
        logger.warning("Recovered %d message(s) from vanished workers: %s", len(ids),
                       "; ".join(f"#{m} ({reason})" for m, _, reason in recovered))
        send_robust(messages_recovered, None, message_ids=ids)
    return ids


def mark_stale_workers(alias: str | None = None) -> int:
    """Mark workers whose heartbeat is older than a lease as stopped; return how many."""
    with _connection(alias).cursor() as cursor:
        cursor.execute(MARK_STALE_WORKERS_SQL, [_micros(get_settings().LEASE_SECONDS)])
        return int(cursor.rowcount)


def _recover_one(alias: str, message_id: int, token: str, reason: str) -> bool:
    error = f"WorkerLost: {reason}"

    def body(cursor: Any) -> bool:
        cursor.execute(
            f"SELECT attempts >= max_attempts FROM {MESSAGE_TABLE} "
            "WHERE id = %s AND claim_token = %s FOR UPDATE",
            [message_id, token],
        )
        row = cursor.fetchone()
        if row is None:
            return False  # acked or released meanwhile
        outcome = Outcome.FAILED if row[0] else Outcome.LOST
        cursor.execute(_HISTORY_FROM_MESSAGE,
                       [outcome, "WorkerLost", reason, outcome == Outcome.FAILED, message_id])
        cursor.execute(RECOVER_SQL, [error, message_id, token])
        return True

    return _in_transaction(alias, body)


# --------------------------------------------------------------------------- workers


LISTEN_SQL = f"""
UPDATE {WORKER_TABLE} SET listening = %s, connection_id = CONNECTION_ID() WHERE id = %s
"""
#: Parked workers of a queue. Only rows renewed within a lease and since the server
#: started count: a dead worker's connection id may belong to someone else by now.
LISTENERS_SQL = f"""
SELECT connection_id FROM {WORKER_TABLE}
 WHERE listening = 1 AND stopped_at IS NULL AND FIND_IN_SET(%s, queues)
   AND last_heartbeat > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND
"""
#: Parks an idle worker: returns at once if its queues have ready messages or a scheduled
#: message is due, else sleeps (at most %s seconds, or until the next message is due)
#: until a producer's KILL QUERY cuts the SLEEP short. The check and the sleep are one
#: statement, so a wake-up can't fall between them.
_IDLE_WAIT_SQL = f"""
SELECT CASE
         WHEN %s = 'leader' AND EXISTS (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_lease)
                                          WHERE status = 'claimed') THEN 'sweep'
         WHEN %s = 'follower' AND IS_FREE_LOCK({RECOVERY_LOCK_NAME}) = 1 THEN 'sweep'
         WHEN EXISTS (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
                       WHERE queue IN ({{queues}}) AND status = 'ready') THEN 'ready'
         WHEN due.wait <= 0 THEN 'due'
         WHEN SLEEP(LEAST(%s, due.wait)) = 1 THEN 'woken'
         ELSE 'slept'
       END,
       (SELECT COALESCE(GROUP_CONCAT(queue ORDER BY queue SEPARATOR ','), '')
          FROM {QUEUE_TABLE} WHERE paused = 1 AND queue IN ({{queues}}))
  FROM (SELECT COALESCE(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(run_at)) / 1000000,
                        %s) AS wait
          FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
         WHERE status = 'scheduled') AS due
"""


def listen(worker_id: str, listening: bool) -> None:
    """Say whether this worker is parked (and on which connection) for producers to wake."""
    def run() -> None:
        with _connection().cursor() as cursor:
            cursor.execute(LISTEN_SQL, [listening, worker_id])

    _with_lock_retry(_alias(), run)


def idle_wait(queues: Sequence[str], seconds: float, sweep_check: str = "",
              watched: Sequence[str] = ()) -> tuple[str, str | None]:
    """Park until woken, work is ready or ``seconds`` pass: ``ready``, ``due``, ``woken``
    (``interrupted`` if the wake-up came before the statement's checks ran) or ``slept``;
    with the paused ones among the ``watched`` queues as they were when it returned
    (comma-separated, None when interrupted), so a parked worker sees a pause for free.

    ``sweep_check`` folds the recovery duty into the park, so an idle cluster pays no
    separate sweep: ``leader`` returns ``sweep`` at once if any message is claimed (there
    may be a dead owner to judge), ``follower`` if the recovery lock is free (the leader
    is gone). Both are checked when the statement starts, before it sleeps.
    """
    watched = list(watched) or list(queues)
    sql = _IDLE_WAIT_SQL.replace("{queues}", ", ".join(["%s"] * len(queues)), 1).replace(
        "{queues}", ", ".join(["%s"] * len(watched)), 1)
    try:
        with _connection().cursor() as cursor:
            cursor.execute(sql, [sweep_check, sweep_check, *queues, seconds, *watched,
                                 seconds])
            state, paused = cursor.fetchone()
            return str(state), str(paused)
    except OperationalError as exc:
        if _error_code(exc) == QUERY_INTERRUPTED:  # killed before SLEEP itself began
            return "interrupted", None
        raise


class _WakeState:
    """Per producer process: when each queue was last seen without listeners."""

    #: Seconds a 'nobody is listening' answer is trusted; parked workers' first sleeps
    #: are shorter than this plus their recheck, so no message waits on a stale answer.
    QUIET_SECONDS = 0.02

    def __init__(self) -> None:
        self.quiet_since: dict[tuple[str, str], float] = {}
        self.disabled = False


_wake_state = _WakeState()


def wake(queues: Sequence[str], alias: str | None = None) -> int:
    """Wake workers parked on these queues (after a commit); return how many were woken."""
    alias = alias or _alias()
    state = _wake_state
    conf = get_settings()
    if state.disabled or not conf.WAKEUP:
        return 0
    now = time.monotonic()
    # Most enqueues of a busy producer end here: nobody listened a moment ago.
    unknown = [queue for queue in dict.fromkeys(queues)
               if now - state.quiet_since.get((alias, queue), -1.0) >= state.QUIET_SECONDS]
    if not unknown:
        return 0
    woken = 0
    _, server_start = connection_identity(alias)
    recent = min(conf.LEASE_SECONDS, max(0.0, time.time() - server_start))
    with _connection(alias).cursor() as cursor:
        for queue in unknown:
            key = (alias, queue)
            cursor.execute(LISTENERS_SQL, [queue, _micros(recent)])
            listeners = [int(row[0]) for row in cursor.fetchall() if row[0]]
            if not listeners:
                state.quiet_since[key] = now
                continue
            state.quiet_since.pop(key, None)
            for connection_id in listeners:
                try:
                    cursor.execute("KILL QUERY %s", [connection_id])
                    woken += 1
                except OperationalError as exc:
                    if _error_code(exc) == 1094:  # that worker is gone already
                        continue
                    state.disabled = True
                    logger.warning(
                        "Can't wake idle workers (%s): this database user may not KILL "
                        "their queries. Workers fall back to polling; give the user the "
                        "CONNECTION ADMIN privilege, run workers as the same user, or set "
                        "MYSQLQ['WAKEUP'] = False.", exc)
                    return woken
    return woken


def register_worker(worker_id: str, host: str, pid: int, queues: Sequence[str],
                    concurrency: int) -> None:
    with _connection().cursor() as cursor:
        cursor.execute(REGISTER_WORKER_SQL,
                       [worker_id, host[:255], pid, ",".join(queues)[:1000], concurrency])


def heartbeat_worker(worker_id: str, processed: int, failed: int,
                     listening: bool = False) -> None:
    def run() -> None:
        with _connection().cursor() as cursor:
            cursor.execute(HEARTBEAT_WORKER_SQL, [processed, failed, listening, worker_id])

    _with_lock_retry(_alias(), run)


def deregister_worker(worker_id: str, processed: int, failed: int) -> None:
    with _connection().cursor() as cursor:
        cursor.execute(STOP_WORKER_SQL, [processed, failed, worker_id])


def queue_counts(queues: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """``{queue: {status: count}}`` of unfinished messages."""
    sql = f"SELECT queue, status, COUNT(*) FROM {MESSAGE_TABLE}"
    params: list[Any] = []
    if queues:
        sql += " WHERE queue IN (" + ", ".join(["%s"] * len(queues)) + ")"
        params = list(queues)
    sql += " GROUP BY queue, status"
    counts: dict[str, dict[str, int]] = {}
    with _connection().cursor() as cursor:
        cursor.execute(sql, params)
        for queue, status, count in cursor.fetchall():
            counts.setdefault(queue, {})[status] = int(count)
    return counts


def has_pending(queues: Sequence[str], scheduled_within: float) -> bool:
    """Whether these queues hold ready or claimed messages, or scheduled ones due soon.

    ``--burst`` workers stop when this turns false; retries due within
    ``scheduled_within`` seconds still count as work to wait for.
    """
    placeholders = ", ".join(["%s"] * len(queues))
    with _connection().cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {MESSAGE_TABLE} WHERE queue IN ({placeholders}) AND "
            "(status IN (%s, %s) OR (status = %s AND "
            "run_at <= UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)) LIMIT 1",
            [*queues, MessageStatus.READY, MessageStatus.CLAIMED, MessageStatus.SCHEDULED,
             _micros(scheduled_within)],
        )
        return cursor.fetchone() is not None


def ensure_usable(alias: str | None = None) -> None:
    """Ping this thread's connection and drop it if the server has gone away meanwhile.

    Django only notices a dead idle connection when a query fails; a task must not pay
    for an outage with one of its attempts.
    """
    connection = _connection(alias)
    if connection.connection is not None and not connection.is_usable():
        connection.close()


def close_if_broken(alias: str | None = None) -> None:
    """Drop this thread's connection if it is unusable, so the next query reconnects."""
    try:
        _connection(alias).close_if_unusable_or_obsolete()
    except DatabaseError:
        _connection(alias).close()


# --------------------------------------------------------------------------- operators
#
# What the admin and the CLI do to messages. Every action locks the rows it may change
# (``FOR UPDATE``, only in the statuses it allows: never ``claimed``), writes one history
# row per message naming the operator, and changes the rows, in one transaction. A
# message a worker claims meanwhile is simply not matched: actions never touch a message
# a live worker runs.

#: Ids per operator transaction: bounds lock time and statement size.
OPERATOR_CHUNK = 500

_OPERATOR_HISTORY_SQL = f"""
INSERT INTO {ATTEMPT_TABLE}
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload, actor)
SELECT id, queue, task_name, attempts, %s, priority, enqueued_at, NULL,
       UTC_TIMESTAMP(6), '', %s, %s, NULL, '', '', %s, '', NULL, IF(%s, payload, ''), %s
  FROM {MESSAGE_TABLE}
 WHERE id IN ({{ids}})
"""
_LOCK_OPERABLE_SQL = f"""
SELECT id, queue FROM {MESSAGE_TABLE}
 WHERE id IN ({{ids}}) AND status IN ({{statuses}})
 ORDER BY id
   FOR UPDATE
"""
REQUEUE_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = 'ready', run_at = UTC_TIMESTAMP(6), attempts = IF(%s, 0, attempts)
 WHERE id IN ({{ids}})
"""
CANCEL_SQL = f"DELETE FROM {MESSAGE_TABLE} WHERE id IN ({{ids}})"
PRIORITY_SQL = f"UPDATE {MESSAGE_TABLE} SET priority = %s WHERE id IN ({{ids}})"

#: Every claimed message with what an operator needs to judge it (walks mysqlq_msg_lease).
STUCK_CANDIDATES_SQL = f"""
SELECT id, claim_token, owner_connection, owner_server_start,
       lease_expires_at < UTC_TIMESTAMP(6) AS expired,
       timeout IS NOT NULL
         AND claimed_at + INTERVAL ROUND(timeout * 1000000) MICROSECOND
             < UTC_TIMESTAMP(6) AS overran
  FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_lease)
 WHERE status = 'claimed'
"""
_LOCK_CLAIMED_SQL = f"""
SELECT claim_token, owner_connection, owner_server_start,
       lease_expires_at < UTC_TIMESTAMP(6)
  FROM {MESSAGE_TABLE}
 WHERE id = %s AND status = 'claimed'
   FOR UPDATE
"""

SET_PAUSED_SQL = f"""
INSERT INTO {QUEUE_TABLE} (queue, paused, changed_at, changed_by)
VALUES (%s, %s, UTC_TIMESTAMP(6), %s)
ON DUPLICATE KEY UPDATE paused = VALUES(paused), changed_at = VALUES(changed_at),
       changed_by = VALUES(changed_by)
"""
PAUSED_QUEUES_SQL = f"SELECT queue FROM {QUEUE_TABLE} WHERE paused = 1"

REPLAY_SOURCE_SQL = f"""
SELECT message_id, queue, task_name, priority, payload FROM {ATTEMPT_TABLE} WHERE id = %s
"""

#: Per queue and status: count, and the smallest id (the oldest ready message). Covered
#: by the claim index, whose prefix is exactly (queue, status).
OVERVIEW_SQL = f"""
SELECT queue, status, COUNT(*), MIN(id)
  FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
 GROUP BY queue, status
"""
ENQUEUED_AT_SQL = f"SELECT id, enqueued_at FROM {MESSAGE_TABLE} WHERE id IN ({{ids}})"
#: History of the last %s minutes, bucketed by minutes ago: a range of mysqlq_att_finished.
HISTORY_WINDOW_SQL = f"""
SELECT queue, task_name, outcome,
       TIMESTAMPDIFF(MINUTE, finished_at, UTC_TIMESTAMP(6)) AS minutes_ago, COUNT(*)
  FROM {ATTEMPT_TABLE} FORCE INDEX (mysqlq_att_finished)
 WHERE finished_at >= UTC_TIMESTAMP(6) - INTERVAL %s MINUTE
 GROUP BY queue, task_name, outcome, minutes_ago
"""
WORKERS_ALIVE_SQL = f"""
SELECT COUNT(*) FROM {WORKER_TABLE} FORCE INDEX (mysqlq_wrk_heartbeat)
 WHERE last_heartbeat > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND AND stopped_at IS NULL
"""

#: One retention batch: oldest first along mysqlq_att_finished, so each batch is short.
PURGE_SQL = f"""
DELETE FROM {ATTEMPT_TABLE} WHERE finished_at < %s ORDER BY finished_at LIMIT %s
"""
PURGE_COUNT_SQL = f"SELECT COUNT(*) FROM {ATTEMPT_TABLE} WHERE finished_at < %s"


@dataclasses.dataclass(frozen=True)
class Operator:
    """Who asked for an operator action; written into the history row's ``actor``."""

    name: str
    host: str = ""
    pid: int | None = None


@dataclasses.dataclass(frozen=True)
class Stuck:
    """A claimed message that looks stuck, and whether releasing it is safe."""

    id: int
    reason: str
    #: False when its worker is alive (only overrunning): releasing would run it twice.
    releasable: bool


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def _operate(ids: Sequence[int], operator: Operator, outcome: str, note: str,
             change: Callable[[Any, list[int]], None], *, keep_payload: bool = False,
             statuses: Sequence[str] = OPERABLE_STATUSES) -> list[int]:
    """Lock the operable rows among ``ids``, record ``outcome`` for each, apply ``change``.

    Returns the ids changed; the others were gone, running or in another status.
    """
    alias = _alias()
    done: list[int] = []
    queues: set[str] = set()
    unique = sorted({int(i) for i in ids})
    for start in range(0, len(unique), OPERATOR_CHUNK):
        chunk = unique[start:start + OPERATOR_CHUNK]

        def body(cursor: Any, chunk: list[int] = chunk) -> list[tuple[int, str]]:
            cursor.execute(
                _LOCK_OPERABLE_SQL.format(ids=_placeholders(len(chunk)),
                                          statuses=_placeholders(len(statuses))),
                [*chunk, *statuses],
            )
            locked = [(int(row[0]), str(row[1])) for row in cursor.fetchall()]
            if not locked:
                return []
            locked_ids = [message_id for message_id, _ in locked]
            cursor.execute(
                _OPERATOR_HISTORY_SQL.format(ids=_placeholders(len(locked_ids))),
                [outcome, operator.host[:255], operator.pid, note, keep_payload,
                 operator.name[:200], *locked_ids],
            )
            change(cursor, locked_ids)
            return locked

        for message_id, queue in _in_transaction(alias, body):
            done.append(message_id)
            queues.add(queue)
    if queues and outcome == Outcome.REQUEUED:
        try:
            wake(sorted(queues), alias)
        except DatabaseError as exc:
            logger.warning("Could not wake idle workers after a requeue (%s).", exc)
    return done


def requeue(ids: Sequence[int], operator: Operator, *, reset_attempts: bool = False,
            statuses: Sequence[str] = OPERABLE_STATUSES) -> list[int]:
    """Make ready, scheduled or dead messages ready now; return the ids requeued.

    Without ``reset_attempts`` a dead message gets one more attempt; with it, a full set.
    ``statuses`` narrows which messages qualify (``("dead",)`` to retry dead ones only).
    """
    if not set(statuses) <= set(OPERABLE_STATUSES):
        raise ValueError(f"Only ready, scheduled or dead messages can be requeued, not "
                         f"{sorted(set(statuses) - set(OPERABLE_STATUSES))}.")
    note = "requeued" + (" with attempts reset" if reset_attempts else "")

    def change(cursor: Any, locked: list[int]) -> None:
        cursor.execute(REQUEUE_SQL.format(ids=_placeholders(len(locked))),
                       [reset_attempts, *locked])

    return _operate(ids, operator, Outcome.REQUEUED, note, change, statuses=statuses)


def cancel(ids: Sequence[int], operator: Operator) -> list[int]:
    """Delete ready, scheduled or dead messages, keeping their payload in history."""
    def change(cursor: Any, locked: list[int]) -> None:
        cursor.execute(CANCEL_SQL.format(ids=_placeholders(len(locked))), locked)

    return _operate(ids, operator, Outcome.CANCELLED, "cancelled", change, keep_payload=True)


def set_priority(ids: Sequence[int], priority: int, operator: Operator) -> list[int]:
    """Change the priority of ready, scheduled or dead messages (history keeps the old one)."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ValueError(f"priority must be an integer from -100 to 100, not {priority!r}.")

    def change(cursor: Any, locked: list[int]) -> None:
        cursor.execute(PRIORITY_SQL.format(ids=_placeholders(len(locked))), [priority, *locked])

    return _operate(ids, operator, Outcome.PRIORITY, f"priority set to {priority}", change)


def _live_connections(cursor: Any, liveness: str) -> set[int]:
    if liveness != "connection":
        return set()
    cursor.execute(LIVE_CONNECTIONS_SQL)
    return {int(row[0]) for row in cursor.fetchall()}


def stuck_messages(liveness: str | None = None) -> list[Stuck]:
    """Claimed messages whose owner is gone, whose lease ran out, or past their timeout."""
    liveness = liveness or get_settings().LIVENESS
    _, server_start = connection_identity()
    with _connection().cursor() as cursor:
        cursor.execute(STUCK_CANDIDATES_SQL)
        rows = cursor.fetchall()
        if not rows:
            return []
        live = _live_connections(cursor, liveness)
    stuck = []
    for message_id, _token, owner, owner_start, expired, overran in rows:
        reason = _loss_reason(owner, owner_start, bool(expired), live, liveness, server_start)
        if reason is not None:
            stuck.append(Stuck(int(message_id), reason, True))
        elif overran:
            stuck.append(Stuck(int(message_id), "running past its timeout (worker alive)",
                               False))
    return stuck


def release_stuck(ids: Sequence[int], operator: Operator) -> dict[int, str]:
    """Give stuck claims back to the queue; return ``{id: reason}`` of those released.

    A claim is released only if recovery would take it too (owner connection gone, server
    restarted, or lease expired), judged again under the row lock. A message whose worker
    is alive is refused even if it overran: the worker is still running it.
    """
    alias = _alias()
    liveness = get_settings().LIVENESS
    _require_autocommit(alias, "release_stuck()")
    _, server_start = connection_identity(alias)
    released: dict[int, str] = {}
    for message_id in sorted({int(i) for i in ids}):
        def body(cursor: Any, message_id: int = message_id) -> str | None:
            cursor.execute(_LOCK_CLAIMED_SQL, [message_id])
            row = cursor.fetchone()
            if row is None:
                return None
            token, owner, owner_start, expired = row
            live = _live_connections(cursor, liveness)
            reason = _loss_reason(owner, owner_start, bool(expired), live, liveness,
                                  server_start)
            if reason is None:
                return None
            cursor.execute(f"SELECT attempts >= max_attempts FROM {MESSAGE_TABLE} "
                           "WHERE id = %s", [message_id])
            out_of_attempts = bool(cursor.fetchone()[0])
            outcome = Outcome.FAILED if out_of_attempts else Outcome.RELEASED
            note = f"claim released by an operator: {reason}"
            cursor.execute(_OPERATOR_HISTORY_SQL.format(ids="%s"),
                           [outcome, operator.host[:255], operator.pid, note, out_of_attempts,
                            operator.name[:200], message_id])
            cursor.execute(RECOVER_SQL, [f"WorkerLost: {reason}", message_id, token])
            return reason

        reason = _in_transaction(alias, body)
        if reason is not None:
            released[message_id] = reason
    return released


def replay(attempt_id: int, operator: Operator) -> int:
    """Enqueue a copy of the message a history row finished; return the new message's id.

    Only final rows keep the payload (succeeded, failed, cancelled). Attempts and backoff
    come from the task's current definition when this process knows the task, else from
    the settings' defaults.
    """
    from .exceptions import UnknownTask
    from .tasks import registry

    alias = _alias()
    with _connection(alias).cursor() as cursor:
        cursor.execute(REPLAY_SOURCE_SQL, [attempt_id])
        row = cursor.fetchone()
    if row is None:
        raise LookupError(f"History row {attempt_id} does not exist (purged?).")
    message_id, queue, task_name, priority, payload = row
    if not payload:
        raise ValueError(
            f"History row {attempt_id} keeps no arguments: only the final row of a message "
            "(succeeded, failed or cancelled) can be replayed; pick that one.")
    conf = get_settings()
    try:
        task = registry.get(task_name)
        max_attempts, backoff, timeout = task.max_attempts, task.retry_backoff, task.timeout
    except UnknownTask:
        max_attempts, backoff, timeout = conf.MAX_ATTEMPTS, conf.RETRY_BACKOFF, None
    message = NewMessage(task_name=task_name, queue=queue, priority=int(priority),
                         payload=payload, run_at=None, delay=0.0, max_attempts=max_attempts,
                         retry_backoff=backoff, timeout=timeout, dedup_key=None)
    with transaction.atomic(using=alias):
        [new_id] = enqueue([message])
        with _connection(alias).cursor() as cursor:
            cursor.execute(
                _OPERATOR_HISTORY_SQL.format(ids="%s"),
                [Outcome.REPLAYED, operator.host[:255], operator.pid,
                 f"replay of history row {attempt_id} (message #{message_id})", False,
                 operator.name[:200], new_id])
    return new_id


def set_paused(queue: str, paused: bool, operator: Operator) -> None:
    """Pause or resume a queue.

    Busy workers re-read the paused set about every second; parked ones re-read it before
    their next claim, and are woken here so that happens now.
    """
    with _connection().cursor() as cursor:
        cursor.execute(SET_PAUSED_SQL, [queue, paused, operator.name[:200]])

    def wake_parked() -> None:
        try:
            wake([queue])
        except DatabaseError as exc:
            logger.warning("Could not wake idle workers after %s %s (%s).",
                           "pausing" if paused else "resuming", queue, exc)

    # After the commit: a worker woken earlier would read the old state and park again.
    transaction.on_commit(wake_parked, using=_alias())


def paused_queues(alias: str | None = None) -> set[str]:
    """Names of the queues an operator paused."""
    with _connection(alias).cursor() as cursor:
        cursor.execute(PAUSED_QUEUES_SQL)
        return {str(row[0]) for row in cursor.fetchall()}


@dataclasses.dataclass(frozen=True)
class QueueOverview:
    """Unfinished messages of a queue by status, and when its oldest ready one was queued."""

    counts: dict[str, int]
    oldest_ready_at: dt.datetime | None


def queue_overview() -> dict[str, QueueOverview]:
    """Per queue: counts by status and the enqueue time of the oldest ready message."""
    with _connection().cursor() as cursor:
        cursor.execute(OVERVIEW_SQL)
        rows = cursor.fetchall()
        oldest_ids = {int(row[3]): str(row[0]) for row in rows
                      if row[1] == MessageStatus.READY}
        oldest: dict[str, dt.datetime] = {}
        if oldest_ids:
            cursor.execute(ENQUEUED_AT_SQL.format(ids=_placeholders(len(oldest_ids))),
                           list(oldest_ids))
            for message_id, enqueued_at in cursor.fetchall():
                if timezone.is_naive(enqueued_at):
                    enqueued_at = enqueued_at.replace(tzinfo=dt.UTC)
                oldest[oldest_ids[int(message_id)]] = enqueued_at
    counts: dict[str, dict[str, int]] = {}
    for queue, status, count, _ in rows:
        counts.setdefault(str(queue), {})[str(status)] = int(count)
    return {queue: QueueOverview(by_status, oldest.get(queue))
            for queue, by_status in counts.items()}


@dataclasses.dataclass(frozen=True)
class HistoryBucket:
    """History rows of one queue, task and outcome that finished ``minutes_ago`` minutes ago."""

    queue: str
    task_name: str
    outcome: str
    minutes_ago: int
    count: int


def history_window(minutes: int = 60) -> list[HistoryBucket]:
    """Attempts finished in the last ``minutes``, counted per queue, task, outcome, minute."""
    with _connection().cursor() as cursor:
        cursor.execute(HISTORY_WINDOW_SQL, [int(minutes)])
        return [HistoryBucket(str(q), str(t), str(o), int(m), int(c))
                for q, t, o, m, c in cursor.fetchall() if o in ATTEMPT_OUTCOMES]


def workers_alive() -> int:
    """Workers that sent a heartbeat within a lease and have not stopped."""
    with _connection().cursor() as cursor:
        cursor.execute(WORKERS_ALIVE_SQL, [_micros(get_settings().LEASE_SECONDS)])
        return int(cursor.fetchone()[0])


ESTIMATED_ROWS_SQL = """
SELECT TABLE_ROWS FROM information_schema.TABLES
 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s
"""


def estimated_history_rows() -> int:
    """The server's estimate of the history's size: free, where COUNT(*) reads it all."""
    with _connection().cursor() as cursor:
        cursor.execute(ESTIMATED_ROWS_SQL, [ATTEMPT_TABLE])
        row = cursor.fetchone()
    return int(row[0] or 0) if row else 0


def count_history_before(before: dt.datetime) -> int:
    """History rows that finished before ``before`` (what a purge would delete)."""
    with _connection().cursor() as cursor:
        cursor.execute(PURGE_COUNT_SQL, [_naive_utc(before)])
        return int(cursor.fetchone()[0])


def purge_history_batch(before: dt.datetime, limit: int) -> int:
    """Delete at most ``limit`` history rows finished before ``before``; return how many.

    Autocommit, oldest first: each batch holds its row locks only for its own statement.
    """
    alias = _alias()
    _require_autocommit(alias, "purge_history_batch()")

    def run() -> int:
        with _connection(alias).cursor() as cursor:
            cursor.execute(PURGE_SQL, [_naive_utc(before), int(limit)])
            return int(cursor.rowcount)

    return _with_lock_retry(alias, run)
