"""What every broker module shares: table names, the connection, lock-conflict retries.

Nothing here moves a message; the stage modules beside it do, each with its own named
statements.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import Signal

from ..conf import get_settings
from ..routing import bind_alias, bound_alias, on_alias
from .isolation import transaction_prelude

logger = logging.getLogger("django_mysqlq")

T = TypeVar("T")

__all__ = ["bind_alias", "on_alias"]  # re-exported: the worker binds its threads

MESSAGE_TABLE = "mysqlq_message"
ATTEMPT_TABLE = "mysqlq_attempt"
WORKER_TABLE = "mysqlq_worker"
QUEUE_TABLE = "mysqlq_queue"
GATE_TABLE = "mysqlq_gate"
SCHEDULE_TABLE = "mysqlq_schedule"

DEADLOCK = 1213
#: A lock wait ran out: a row lock (``innodb_lock_wait_timeout``) or a table's metadata
#: lock (``lock_wait_timeout``: LOCK TABLES, ALTER TABLE) held by another session.
LOCK_WAIT_TIMEOUT = 1205
#: MySQL error codes retried with jitter: deadlock, lock wait timeout.
LOCK_ERRORS = frozenset({DEADLOCK, LOCK_WAIT_TIMEOUT})
#: A wake-up's KILL QUERY that hit a statement instead of a SLEEP: retried at once.
QUERY_INTERRUPTED = 1317
LOCK_RETRY_LIMIT = 8
#: The server refused a statement past ``max_allowed_packet`` (it then drops the connection).
PACKET_TOO_LARGE = 1153
#: A CHECK constraint failed: on the history's ``result`` column, ``JSON_VALID``.
CHECK_FAILED = 4025
#: MySQL's JSON column refused a value as invalid JSON (a number past a double's range).
INVALID_JSON = 3140
#: Errors that refuse the statement itself, which waiting can't fix (unlike an outage):
#: packet too large, a failed CHECK, data too long, an invalid string, MySQL's bad JSON.
REFUSALS = frozenset({PACKET_TOO_LARGE, CHECK_FAILED, 1406, 1366, INVALID_JSON})
#: The connection was lost: an outage, or a statement far past the packet limit.
CONNECTION_LOST = frozenset({2006, 2013})

#: Bounds a session's lock waits and statement time, in seconds (see ``finish_by``).
BOUND_SQL = "SET SESSION innodb_lock_wait_timeout = %s, max_statement_time = %s"
#: MySQL's ``max_execution_time`` bounds SELECTs only: there, lock waits alone.
BOUND_SQL_MYSQL = "SET SESSION innodb_lock_wait_timeout = %s"
UNBOUND_SQL = "SET SESSION innodb_lock_wait_timeout = DEFAULT, max_statement_time = DEFAULT"
UNBOUND_SQL_MYSQL = "SET SESSION innodb_lock_wait_timeout = DEFAULT"
#: The explicit transaction of ``in_transaction`` in autocommit (see there).
START_TRANSACTION_SQL = "START TRANSACTION"
COMMIT_SQL = "COMMIT"
ROLLBACK_SQL = "ROLLBACK"
#: Seconds a bounded statement still gets once its deadline has passed.
SHORTEST_BOUND = 1.0

#: The database clock, for code that compares times the database wrote.
NOW_SQL = "SELECT UTC_TIMESTAMP(6)"


def schema_lock_name(prefix: str) -> str:
    """SQL for a named lock scoped to the schema: ``prefix`` and the database's name, or
    its SHA-1 when the two would pass 64 characters (MySQL refuses a longer lock name
    with error 3057: a database named with 43 or more characters stopped every worker's
    recovery sweep, and with it every claim). Names that fit are kept as they were, so
    workers of the previous version agree with these on the lock."""
    room = 64 - len(prefix)
    return (f"CONCAT('{prefix}', IF(CHAR_LENGTH(DATABASE()) <= {room}, DATABASE(), "
            "SHA1(DATABASE())))")


#: Named lock held by the one recovery sweeper; scoped to the schema, so databases don't
#: share it (used by ``recover`` and by the parked workers' check in ``park``).
RECOVERY_LOCK_NAME = schema_lock_name("django_mysqlq:recover:")

#: The status of a message that may run now: 'ready', or 'throttled' for one with a rate
#: limit, which only a rate-limited claim takes (``rates``). Every statement that makes a
#: message runnable again (promotion, retry, release, recovery, requeue) sets this.
RUNNABLE_STATUS = "IF(rate_key IS NULL, 'ready', 'throttled')"

#: Resets a message's claim columns (a release, a retry, a recovery, a death).
CLEAR_CLAIM = (
    "claim_token = NULL, owner_connection = NULL, owner_server_start = NULL, "
    "worker_id = NULL, claimed_at = NULL, lease_expires_at = NULL"
)


class BrokerStats:
    """Counters the worker reports: lock conflicts retried inside the broker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.deadlocks = 0
        self.lock_waits = 0

    def count(self, code: int) -> None:
        with self._lock:
            if code == DEADLOCK:
                self.deadlocks += 1
            else:
                self.lock_waits += 1


stats = BrokerStats()


def default_alias() -> str:
    """The alias of the statements that name none: this thread's bound alias (a worker's
    threads serve one database each; ``routing.on_alias``), else ``MYSQLQ['DATABASE']``."""
    return bound_alias() or get_settings().DATABASE


def connection_for(alias: str | None = None) -> BaseDatabaseWrapper:
    return connections[alias or default_alias()]


def naive_utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def aware_utc(value: dt.datetime | None) -> dt.datetime | None:
    """A naive time read from the server (UTC) made aware; an aware one, or None, as is."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=dt.UTC)


def micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def error_code(exc: BaseException) -> int | None:
    code = exc.args[0] if exc.args else None
    return code if isinstance(code, int) else None


#: The queue's tables, columns or indexes are missing: migrations not applied (1146 no such
#: table, 1054 unknown column, 1176 FORCE INDEX of a missing index).
SCHEMA_ERRORS = frozenset({1146, 1054, 1176})
#: The database is unknown (1049) or the server refuses this login (1045, 1698) or a
#: grant (1044 database, 1142 table, 1143 column): someone has to fix the settings.
SETUP_ERRORS = frozenset({1049, 1045, 1698, 1044, 1142, 1143})


def is_schema_error(exc: BaseException) -> bool:
    return error_code(exc) in SCHEMA_ERRORS


def is_setup_error(exc: BaseException) -> bool:
    return error_code(exc) in SETUP_ERRORS


def is_refusal(exc: BaseException) -> bool:
    """Whether the server refused the statement itself (no outage: a retry can't help)."""
    return error_code(exc) in REFUSALS


_bound = threading.local()
_BOUNDED_ATTRIBUTE = "_django_mysqlq_bounded"


def finish_by(deadline: float | None, alias: str | None = None) -> None:
    """Make this thread's queue statements end by ``deadline`` (``time.monotonic()``).

    A stopping worker must not wait on a lock or a hung statement past its grace period:
    before each statement the session's lock wait and statement time limits are set to
    the time left (at least ``SHORTEST_BOUND``), and lock conflicts are no longer retried
    once the deadline has passed. ``None`` lifts the bound.
    """
    _bound.deadline = deadline
    connection = connection_for(alias)
    if deadline is None and getattr(connection.connection, _BOUNDED_ATTRIBUTE, False):
        with connection.cursor() as cursor:
            mariadb = connection.mysql_is_mariadb  # type: ignore[attr-defined]
            cursor.execute(UNBOUND_SQL if mariadb else UNBOUND_SQL_MYSQL)
        setattr(connection.connection, _BOUNDED_ATTRIBUTE, False)


def past_deadline() -> bool:
    """Whether this thread's ``finish_by`` deadline has passed."""
    deadline: float | None = getattr(_bound, "deadline", None)
    return deadline is not None and time.monotonic() >= deadline


def _apply_bound(alias: str) -> None:
    deadline: float | None = getattr(_bound, "deadline", None)
    if deadline is None:
        return
    seconds = max(SHORTEST_BOUND, deadline - time.monotonic())
    connection = connection_for(alias)
    with connection.cursor() as cursor:
        if connection.mysql_is_mariadb:  # type: ignore[attr-defined]
            cursor.execute(BOUND_SQL, [math.ceil(seconds), round(seconds, 3)])
        else:
            cursor.execute(BOUND_SQL_MYSQL, [math.ceil(seconds)])
    setattr(connection.connection, _BOUNDED_ATTRIBUTE, True)


def is_lock_wait(exc: BaseException) -> bool:
    """Whether a statement gave up waiting for a lock another session holds (1205)."""
    return isinstance(exc, OperationalError) and error_code(exc) == LOCK_WAIT_TIMEOUT


def lock_waits_final(final: bool) -> bool:
    """Make this thread's lock-wait timeouts final (``with_lock_retry`` raises them at
    once) or retried again; return the previous state.

    A housekeeping step that waited its bounded time for a lock a stranger holds must
    give up, not wait again seven times: the control loop behind it claims and recovers.
    """
    previous = bool(getattr(_bound, "waits_final", False))
    _bound.waits_final = final
    return previous


def _wait_is_final(code: int | None) -> bool:
    return code == LOCK_WAIT_TIMEOUT and bool(getattr(_bound, "waits_final", False))


def was_interrupted(exc: BaseException) -> bool:
    """Whether a statement was cut short by ``KILL QUERY`` (a wake-up that came late)."""
    return isinstance(exc, OperationalError) and error_code(exc) == QUERY_INTERRUPTED


def with_lock_retry(alias: str, operation: Callable[[], T],
                    codes: frozenset[int] = LOCK_ERRORS) -> T:
    """Run ``operation``; retry it on deadlock/lock-wait errors (``codes``) with jittered
    backoff.

    Only valid outside the caller's transaction: inside one, a deadlock has already
    rolled back everything else, so the error must reach the caller.
    """
    connection = connection_for(alias)
    for attempt in range(LOCK_RETRY_LIMIT):
        try:
            _apply_bound(alias)
            return operation()
        except OperationalError as exc:
            code = error_code(exc)
            if (
                code not in codes | {QUERY_INTERRUPTED}
                or connection.in_atomic_block
                or attempt == LOCK_RETRY_LIMIT - 1
                or past_deadline()
                or _wait_is_final(code)
            ):
                raise
            if code == QUERY_INTERRUPTED:
                continue  # an autocommit statement killed by a late wake-up: harmless
            stats.count(code)
            time.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))
    raise AssertionError("unreachable")


def only_test_transactions(connection: BaseDatabaseWrapper) -> bool:
    """Whether every open ``atomic()`` block is one a Django ``TestCase`` opened around the
    test (they never commit): code there runs as it would in autocommit, and a claim made
    there is the test's own (``django_mysqlq.testing.drain``)."""
    blocks = connection.atomic_blocks
    return bool(blocks) and all(getattr(block, "_from_testcase", False) for block in blocks)


def require_autocommit(alias: str, what: str) -> None:
    connection = connection_for(alias)
    if connection.in_atomic_block and not only_test_transactions(connection):
        raise RuntimeError(
            f"{what} must run in autocommit mode, outside transaction.atomic(): a claim "
            "held inside an open transaction is invisible to peers and can't be recovered."
        )


def in_transaction(alias: str, body: Callable[[Any], T]) -> T:
    """Run ``body(cursor)`` in one transaction, retried on deadlocks and lock waits.

    In autocommit (the worker's case) the transaction is an explicit ``START TRANSACTION``
    … ``COMMIT``: Django's ``atomic()`` would add two ``SET autocommit`` round trips,
    a third of an ack batch's statements. It runs at READ COMMITTED (see ``isolation``).
    Inside a caller's transaction, ``atomic()`` nests as usual, at the caller's level.
    """
    connection = connection_for(alias)

    def nested() -> T:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            return body(cursor)

    def explicit() -> T:
        with connection.cursor() as cursor:
            prelude = transaction_prelude(connection)  # READ COMMITTED, this once
            if prelude is not None:
                cursor.execute(prelude)
            cursor.execute(START_TRANSACTION_SQL)
            try:
                value = body(cursor)
                cursor.execute(COMMIT_SQL)
            except BaseException:
                try:
                    cursor.execute(ROLLBACK_SQL)
                except DatabaseError:
                    pass  # the connection is gone, and with it the transaction
                raise
            return value

    if connection.in_atomic_block or not connection.get_autocommit():
        return with_lock_retry(alias, nested)
    return with_lock_retry(alias, explicit)


def all_or_none(alias: str, statements: int, body: Callable[[], T]) -> T:
    """``body()``, which sends ``statements`` writes to ``alias`` (a long multi-row insert
    split to fit the packet): in one transaction of its own when there are several and
    the caller has none. In autocommit each would commit on its own, and one failing
    after the first would leave those before it written (and delivered) while the call
    raised. Inside the caller's transaction, it is left to that transaction."""
    connection = connection_for(alias)
    if statements < 2 or connection.in_atomic_block or not connection.get_autocommit():
        return body()
    return in_transaction(alias, lambda _cursor: body())



def rows_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
    """A derived table of parameter rows, ``(SELECT %s AS a, %s AS b UNION ALL …)``, and
    its parameters: joined by primary key (``STRAIGHT_JOIN … ON m.id = o.id``) it lets a
    statement touch exactly these rows, one lookup each, never a scan."""
    first = "SELECT " + ", ".join(f"%s AS {name}" for name in columns)
    other = "SELECT " + ", ".join(["%s"] * len(columns))
    sql = "(" + " UNION ALL ".join([first, *[other] * (len(rows) - 1)]) + ")"
    return sql, [value for row in rows for value in row]


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def send_robust(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send a signal; a failing receiver is logged and never breaks the queue's work.

    Each receiver is called here, not through ``Signal.send_robust()``: that catches only
    ``Exception``, and a receiver calling ``sys.exit()`` (or raising another
    ``BaseException``) would end the task thread and leave its message claimed for good.
    Only ``KeyboardInterrupt`` goes through.
    """
    if not signal.receivers:
        return  # (sent twice per task: most have no receiver)
    sync_receivers, async_receivers = signal._live_receivers(sender)
    calls = [(receiver, receiver) for receiver in sync_receivers]
    calls += [(receiver, async_to_sync(receiver)) for receiver in async_receivers]
    for receiver, call in calls:
        try:
            call(signal=signal, sender=sender, **kwargs)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a receiver must not end the thread
            logger.error("Receiver %s of a django_mysqlq signal raised %s; ignored (the "
                         "queue's work goes on). Fix the receiver: it should not raise.",
                         _receiver_name(receiver), type(exc).__name__, exc_info=exc)


def _receiver_name(receiver: Any) -> str:
    module = getattr(receiver, "__module__", None) or "?"
    name = getattr(receiver, "__qualname__", None) or repr(receiver)
    return f"{module}.{name}"


def ensure_usable(alias: str | None = None) -> None:
    """Ping this thread's connection and drop it if the server has gone away meanwhile.

    Django only notices a dead idle connection when a query fails; a task must not pay
    for an outage with one of its attempts.
    """
    connection = connection_for(alias)
    if connection.connection is not None and not connection.is_usable():
        connection.close()


def connection_lost(alias: str | None = None) -> bool:
    """Whether this thread has no working connection after a failed statement: none open
    (the server could not be reached), or one that no longer answers a ping. Not every
    failed statement means that: a plain error leaves the session usable."""
    connection = connection_for(alias)
    return connection.connection is None or not connection.is_usable()


def close_if_broken(alias: str | None = None) -> None:
    """Drop this thread's connection if it is unusable, so the next query reconnects."""
    connection = connection_for(alias)
    if connection.in_atomic_block and only_test_transactions(connection):
        return  # Django would drop the test's own transaction (autocommit looks wrong)
    try:
        connection.close_if_unusable_or_obsolete()
    except DatabaseError:
        connection_for(alias).close()

