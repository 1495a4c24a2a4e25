"""Who a broker connection is: its connection id and the server's start time."""

from __future__ import annotations

import datetime as dt
import time

from django.utils import timezone

from .base import connection_for, logger

#: Seconds of tolerance when comparing server start times. On MariaDB and MySQL ``Uptime``
#: is the statement's start minus the server's start on the same wall clock, so a clock
#: step moves ``@@timestamp`` and ``Uptime`` alike and the start computed before and after
#: it agree; what differs is the second between the two statements of one measurement
#: (more if that connection stalls, or if the clock steps just then). A restart the slack
#: hides (a server that ran less than this long) is still caught: the owner's connection
#: died with the server, so either it reconnects and re-stamps its claims at its next
#: heartbeat, or nobody renews them and their lease runs out.
SERVER_START_SLACK = 60

#: ``@@timestamp`` is the statement's start in epoch seconds with microseconds, free of
#: the session time zone (``UNIX_TIMESTAMP(NOW(6))`` converts through it and is an hour
#: off during a DST fall-back hour; past 2038 it is NULL on older servers).
IDENTITY_SQL = "SELECT CONNECTION_ID(), @@timestamp"
#: Works on MariaDB and MySQL 8 alike (MySQL 8 dropped information_schema.GLOBAL_STATUS).
UPTIME_SQL = "SHOW GLOBAL STATUS LIKE 'Uptime'"

_IDENTITY_ATTRIBUTE = "_django_mysqlq_identity"
#: ``Uptime`` is unsigned on the wire: a session clock behind the server's start wraps it.
_UNSIGNED_WRAP = 2**64


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
        # The timestamp first: a stall before the Uptime read makes this start look
        # older (only this connection's claims at risk), never newer (a recovery leader
        # taking everyone's).
        sent = time.time()
        cursor.execute(IDENTITY_SQL)
        connection_id, server_now = cursor.fetchone()
        received = time.time()
        cursor.execute(UPTIME_SQL)
        uptime = int(cursor.fetchone()[1])
    identity = (int(connection_id), server_start(server_now, uptime, (sent + received) / 2))
    setattr(raw, _IDENTITY_ATTRIBUTE, identity)
    return identity


_warned_no_server_clock = False


def server_start(server_now: float | None, uptime: int, client_now: float) -> int:
    """The server's start epoch from its clock and ``Uptime``; records the clock offset.

    A server that can't say what time it is (NULL) is measured by this host's clock,
    with one warning: that is sound while the clocks agree within SERVER_START_SLACK.
    """
    global _clock_offset, _warned_no_server_clock
    if uptime >= _UNSIGNED_WRAP // 2:
        uptime -= _UNSIGNED_WRAP
    if server_now is None:
        if not _warned_no_server_clock:
            _warned_no_server_clock = True
            logger.warning(
                "The database server returned no current time; django_mysqlq estimates "
                "the server's start from this host's clock instead. Keep this host's clock "
                "within %d s of the server's (NTP), or claims may be judged wrongly after "
                "a server restart.", SERVER_START_SLACK)
        _clock_offset = 0.0
        return int(client_now) - uptime
    now = float(server_now)
    _clock_offset = now - client_now
    return int(now) - uptime


#: Database clock minus this host's clock, in seconds, measured with each new connection.
_clock_offset = 0.0


def database_now() -> dt.datetime:
    """Now on the database clock (estimated), so history times agree with ``enqueued_at``."""
    return timezone.now() + dt.timedelta(seconds=_clock_offset)
