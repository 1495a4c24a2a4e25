"""A connection's session as the server sees it: its id, the server's start time, and
whether a transaction was left open on it."""

from __future__ import annotations

import datetime as dt
import time

from django.db import OperationalError
from django.utils import timezone

from .base import connection_for, error_code

#: Seconds of tolerance when comparing server start times (Uptime has 1 s resolution).
SERVER_START_SLACK = 2

IDENTITY_SQL = "SELECT CONNECTION_ID(), UNIX_TIMESTAMP(NOW(6))"
#: Works on MariaDB and MySQL 8 alike (MySQL 8 dropped information_schema.GLOBAL_STATUS).
UPTIME_SQL = "SHOW GLOBAL STATUS LIKE 'Uptime'"


_IDENTITY_ATTRIBUTE = "_django_mysqlq_identity"


def connection_identity(alias: str | None = None) -> tuple[int, int]:
    """``(CONNECTION_ID(), server start epoch)`` of this thread's connection.

    Cached on the driver's connection object, so a reconnect (a new object) asks again.
    """
    connection = connection_for(alias)
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



# --------------------------------------------------------------------------- leaks

#: Whether the session has a transaction open, and whether autocommit is on (MariaDB).
SESSION_TRANSACTION_SQL = "SELECT @@in_transaction, @@autocommit"
AUTOCOMMIT_SQL = "SELECT @@autocommit"
#: Refused with error 1568 while a transaction is open, on MySQL and MariaDB alike; outside
#: one it only sets the next transaction's access mode to the default.
NEXT_TRANSACTION_SQL = "SET TRANSACTION READ WRITE"
TRANSACTION_IN_PROGRESS = 1568


def transaction_left_open(alias: str, via: str | None = None) -> bool:
    """Whether this thread's connection has a transaction open on the server, or autocommit
    off, whatever Django believes: a task may have sent ``START TRANSACTION`` or
    ``SET autocommit = 0`` through a raw cursor.

    ``via`` forces the ``mariadb`` (``@@in_transaction``) or ``mysql`` (error 1568 on
    ``SET TRANSACTION``) way of asking; by default the server's own.
    """
    connection = connection_for(alias)
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
