"""Who a broker connection is: its connection id and the server's start time."""

from __future__ import annotations

import datetime as dt
import time

from django.utils import timezone

from .base import connection_for

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

