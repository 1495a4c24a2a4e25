"""Who a broker connection is: its connection id, the server's start time, whether a
proxy sits between (then the id is not this process's own), and whether the server is a
node of a Galera cluster (then the id, the process list and the start are that node's)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

from django.utils import timezone

from ..conf import get_settings
from . import cluster, proxy
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
IDENTITY_SQL = f"SELECT CONNECTION_ID(), @@timestamp, ({proxy.SEEN_AS_SQL})"
#: Works on MariaDB and MySQL 8 alike (MySQL 8 dropped information_schema.GLOBAL_STATUS).
#: The wsrep rows say whether the server is a Galera node (Percona XtraDB Cluster too),
#: and which one; a server without Galera has none, or a cluster size of 0.
UPTIME_SQL = (
    "SHOW GLOBAL STATUS WHERE Variable_name IN "
    "('Uptime', 'wsrep_cluster_size', 'wsrep_gcomm_uuid')"
)

_SESSION_ATTRIBUTE = "_django_mysqlq_session"
#: ``Uptime`` is unsigned on the wire: a session clock behind the server's start wraps it.
_UNSIGNED_WRAP = 2**64


@dataclasses.dataclass(frozen=True)
class Session:
    """What the broker measured about one driver connection when it first used it."""

    connection_id: int
    server_start: int
    #: False behind a proxy or pooler: ``connection_id`` is then a backend's, which may
    #: change under this process and may be another client's tomorrow.
    direct: bool
    #: The node of a Galera cluster this connection is on (its ``wsrep_gcomm_uuid``, new
    #: at each start of that node), or "" on a single server. Connection ids, the process
    #: list and ``Uptime`` are that node's alone.
    node: str = ""

    @property
    def cluster(self) -> bool:
        return bool(self.node)

    @property
    def stamps_owner(self) -> bool:
        """Whether claims may carry this connection as their owner, for peers to judge by
        the process list: not behind a proxy, not on a cluster (peers on other nodes
        can't see this connection, and would take a live claim for a dead one)."""
        return self.direct and not self.cluster

    @property
    def owner_start(self) -> int | None:
        """The server start to stamp on claims: none behind a proxy or on a cluster."""
        return self.server_start if self.stamps_owner else None

    def liveness(self, configured: str) -> str:
        """How this connection may judge claims: behind a proxy or on a cluster, only
        leases tell."""
        return configured if self.stamps_owner else "lease"


def connection_session(alias: str | None = None) -> Session:
    """The :class:`Session` of this thread's connection.

    Measured once and cached on the driver's connection object, so a reconnect (a new
    object) measures again.
    """
    connection = connection_for(alias)
    connection.ensure_connection()
    raw = connection.connection
    cached: Session | None = getattr(raw, _SESSION_ATTRIBUTE, None)
    if cached is not None:
        return cached
    with connection.cursor() as cursor:
        # The timestamp first: a stall before the Uptime read makes this start look
        # older (only this connection's claims at risk), never newer (a recovery leader
        # taking everyone's).
        sent = time.time()
        cursor.execute(IDENTITY_SQL)
        connection_id, server_now, seen_as = cursor.fetchone()
        received = time.time()
        cursor.execute(UPTIME_SQL)
        status = {str(name).lower(): value for name, value in cursor.fetchall()}
    uptime = int(status["uptime"])
    node = cluster.node_of(status)
    if node:
        cluster.warn_once(node, status)
    direct = True
    if get_settings().DETECT_PROXY:
        local = proxy.local_end(raw)
        direct = not proxy.through_proxy(local, seen_as)
        if not direct:
            proxy.warn_once(seen_as, local)
    measured = Session(int(connection_id),
                       server_start(server_now, uptime, (sent + received) / 2), direct, node)
    setattr(raw, _SESSION_ATTRIBUTE, measured)
    return measured


def connection_identity(alias: str | None = None) -> tuple[int, int]:
    """``(CONNECTION_ID(), server start epoch)`` of this thread's connection."""
    measured = connection_session(alias)
    return measured.connection_id, measured.server_start


def wakeups_possible(alias: str | None = None) -> bool:
    """Whether idle workers on this connection may park for wake-ups (else they poll).

    Not behind a proxy: a producer's ``KILL QUERY`` can't reach the right connection.
    """
    return get_settings().WAKEUP and connection_session(alias).direct


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
#: The offset it was made of and its timedelta: made again only when the offset changed
#: (``database_now`` runs for every message a worker starts).
_clock_delta = (0.0, dt.timedelta(0))


def database_now() -> dt.datetime:
    """Now on the database clock (estimated), so history times agree with ``enqueued_at``."""
    global _clock_delta
    offset, delta = _clock_delta
    if offset != _clock_offset:
        offset = _clock_offset
        delta = dt.timedelta(seconds=offset)
        _clock_delta = (offset, delta)
    return timezone.now() + delta
