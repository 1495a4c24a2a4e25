"""Transactions a task left open behind Django's back, as the server sees them.

Django's own state (``in_atomic_block``, ``autocommit``) can't see a ``START TRANSACTION``
or ``SET autocommit = 0`` sent through a raw cursor; the worker asks the server after
each task (see ``worker/executor.py``). Asking costs a round trip, so the worker first
takes an *activity mark* of each connection: a task that sent nothing since (most no-op
and non-database tasks) can't have opened anything, and the one change it could make
without a statement, autocommit off through the client library's own call, is known to the
client without asking.
"""

from __future__ import annotations

import weakref
from typing import Any

from django.db import DatabaseError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .base import close_if_broken, connection_for, error_code, only_test_transactions

#: Whether the session has a transaction open, and whether autocommit is on (MariaDB).
SESSION_TRANSACTION_SQL = "SELECT @@in_transaction, @@autocommit"
AUTOCOMMIT_SQL = "SELECT @@autocommit"
#: Refused with error 1568 while a transaction is open, on MySQL and MariaDB alike; outside
#: one it only sets the next transaction's access mode to the default.
NEXT_TRANSACTION_SQL = "SET TRANSACTION READ WRITE"
TRANSACTION_IN_PROGRESS = 1568


class _Sent:
    """How many statements a raw connection was given through ``query`` or ``send_query``."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


#: An activity mark: the raw connection's counter and its value when the mark was taken.
Mark = tuple[_Sent, int]


def _sent(raw: Any) -> _Sent | None:
    """The statement counter of a raw ``MySQLdb`` connection, installed on first use.

    Every statement a cursor (Django's or a raw one) or ``Connection.begin()`` sends goes
    through ``query``; ``send_query`` is the asynchronous way. The wrappers hold the
    connection weakly, so it is freed as before.
    """
    sent = getattr(raw, "_mysqlq_sent", None)
    if isinstance(sent, _Sent):
        return sent
    kind = type(raw)
    if not (hasattr(kind, "query") and hasattr(kind, "send_query")):
        return None  # not a MySQLdb connection: always ask
    sent = _Sent()
    ref = weakref.ref(raw)

    def query(sql: Any) -> Any:
        sent.count += 1
        return kind.query(ref(), sql)

    def send_query(sql: Any) -> Any:
        sent.count += 1
        return kind.send_query(ref(), sql)

    try:
        raw.query = query
        raw.send_query = send_query
        raw._mysqlq_sent = sent
    except (AttributeError, TypeError):
        return None
    return sent


def initialized_connections() -> list[BaseDatabaseWrapper]:
    """This thread's connection wrappers that exist: ``connections.all(initialized_only=
    True)`` with one look into the handler's thread-local storage per alias instead of two
    (each costs about a microsecond; the worker asks twice per task)."""
    storage = getattr(connections, "_connections", None)
    if storage is None:  # not the handler this was written for
        return list(connections.all(initialized_only=True))
    return [wrapper for alias in connections
            if (wrapper := getattr(storage, alias, None)) is not None]


def activity_marks() -> dict[str, Mark]:
    """A mark of what each of this thread's MySQL connections has been sent so far."""
    marks: dict[str, Mark] = {}
    for connection in initialized_connections():
        raw = connection.connection
        if raw is None or connection.vendor != "mysql":
            continue
        sent = getattr(raw, "_mysqlq_sent", None)
        if sent.__class__ is not _Sent:
            sent = _sent(raw)  # (installed on first use)
            if sent is None:
                continue
        marks[connection.alias] = (sent, sent.count)
    return marks


def unchanged_since(raw: Any, mark: Mark | None) -> bool:
    """Whether ``raw`` is the connection ``mark`` was taken of, and was sent nothing since."""
    if mark is None or raw is None:
        return False
    sent, count = mark
    return getattr(raw, "_mysqlq_sent", None) is sent and sent.count == count


def transaction_left_open(alias: str, via: str | None = None,
                          since: Mark | None = None) -> bool:
    """Whether this thread's connection has a transaction open on the server, or autocommit
    off, whatever Django believes: a task may have sent ``START TRANSACTION`` or
    ``SET autocommit = 0`` through a raw cursor.

    ``via`` forces the ``mariadb`` (``@@in_transaction``) or ``mysql`` (error 1568 on
    ``SET TRANSACTION``) way of asking; by default the server's own. With ``since``, an
    activity mark taken when the connection was known clean, a connection sent nothing
    since is answered without a round trip.
    """
    connection = connection_for(alias)
    raw = connection.connection
    if unchanged_since(raw, since):
        # No statement, so no transaction; autocommit turned off by the client library's
        # call (``mysql_autocommit``) shows in the status of the server's last reply.
        return not raw.get_autocommit()
    if via is None:
        via = "mariadb" if connection.mysql_is_mariadb else "mysql"  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        if via == "mariadb":
            cursor.execute(SESSION_TRANSACTION_SQL)
            in_transaction, autocommit = cursor.fetchone()
            return bool(in_transaction) or not autocommit
        cursor.execute(AUTOCOMMIT_SQL)
        if not cursor.fetchone()[0]:
            return True
        try:
            cursor.execute(NEXT_TRANSACTION_SQL)
        except OperationalError as exc:
            if error_code(exc) == TRANSACTION_IN_PROGRESS:
                return True
            raise
    return False


def close_open_transactions(marks: dict[str, Mark] | None = None) -> list[str]:
    """Roll back what user code (a task, a broadcast handler) left open, so the next one on
    this thread starts clean.

    Code that enters ``transaction.atomic()`` without leaving it, turns autocommit off, or
    sends ``START TRANSACTION`` / ``SET autocommit = 0`` through a raw cursor would
    otherwise hold its locks and swallow the writes of everything later on the thread
    (the broker's own statements included: a broadcast reader's locking read of a topic's
    row would be held for good). Django can't see the raw cases, so the server is asked.
    Closing the connection rolls its work back; forgetting the wrapper drops Django's
    atomic state. Returns the aliases that had a transaction open. ``marks`` (taken
    before the user code) spare the question on connections it sent nothing to.
    """
    left_open = []
    for connection in initialized_connections():
        if _left_open(connection, (marks or {}).get(connection.alias)):
            left_open.append(connection.alias)
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - the connection is being thrown away anyway
                pass
            del connections[connection.alias]
    return left_open


def _left_open(connection: BaseDatabaseWrapper, mark: Mark | None) -> bool:
    if connection.connection is None:
        return False  # never connected, or closed: nothing can be open
    if connection.in_atomic_block:
        # Only a TestCase's own transactions (testing.drain() inside a test): they are
        # not the user code's, and the server can't tell its raw one from them.
        return not only_test_transactions(connection)
    if not connection.autocommit:
        return True
    if connection.vendor != "mysql":
        return False
    raw = connection.connection
    if unchanged_since(raw, mark):
        # Sent nothing since the mark: no transaction; autocommit turned off by the
        # driver's own call shows in the status of the server's last reply.
        return not raw.get_autocommit()
    try:
        return transaction_left_open(connection.alias)
    except DatabaseError:
        # Can't ask: the connection is broken, and with it whatever was open.
        close_if_broken(connection.alias)
        return False


def close_broken_connections() -> None:
    """Close this thread's connections, to any database, that a failed statement left
    unusable (the server restarted, the session was killed): the next use reconnects
    instead of failing with "server has gone away" until the process restarts."""
    for connection in initialized_connections():
        if connection.connection is not None and connection.errors_occurred:
            close_if_broken(connection.alias)
