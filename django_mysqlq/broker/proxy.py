"""Is a proxy or pooler between this process and the server? Then connection ids lie.

Behind ProxySQL, RDS Proxy and the like, ``CONNECTION_ID()`` names the proxy's backend
connection: a rotated backend looks like a dead owner, and ``KILL QUERY`` on that id can
end another client's statement. The test: the server's process list says which address
and port each connection comes from; without a proxy, that is this end of our socket.
"""

from __future__ import annotations

import socket
from typing import Any

from ..conf import get_settings
from .base import logger

#: The server's view of this connection: ``ip:port`` over TCP, ``localhost`` over a socket.
#: Evaluated in the same statement as ``CONNECTION_ID()``, so on the same backend.
SEEN_AS_SQL = "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()"

_warned = False


def local_end(raw: Any) -> tuple[int, Any] | None:
    """``(family, address)`` of the driver connection's own socket, or None if unknown."""
    fileno = getattr(raw, "fileno", None)
    if fileno is None:
        return None  # a driver that doesn't expose its socket: can't tell
    try:
        # Wraps the driver's descriptor without duplicating it; detach() below hands it
        # back, so closing this object never closes the driver's connection.
        sock = socket.socket(fileno=fileno())
    except (OSError, ValueError, TypeError):
        return None
    try:
        return int(sock.family), sock.getsockname()
    except OSError:
        return None
    finally:
        sock.detach()


def through_proxy(local: tuple[int, Any] | None, seen_as: str | None) -> bool:
    """Whether the server sees this connection coming from another socket than ours.

    Ports are compared, not addresses: the server may show a resolved host name, and NAT
    rewrites addresses while it usually keeps the port. Unknowns count as direct.
    """
    if local is None or seen_as is None:
        return False
    family, address = local
    if family == socket.AF_UNIX:
        return seen_as != "localhost"
    port = seen_as.rpartition(":")[2]
    return not (port.isdigit() and int(port) == address[1])


def warn_once(seen_as: str | None, local: tuple[int, Any] | None) -> None:
    """Say once per process that a proxy was found and what the queue does about it."""
    global _warned
    conf = get_settings()
    if _warned or (conf.LIVENESS == "lease" and not conf.WAKEUP):
        return  # already said, or configured for it: nothing changes
    _warned = True
    if local is None:
        ours = "unknown"
    elif local[0] == socket.AF_UNIX:
        ours = "a Unix socket"
    else:
        ours = ":".join(str(part) for part in local[1][:2])
    logger.warning(
        "The queue database connection goes through a proxy or pooler: the server sees it "
        "from %s, this process's socket is %s. CONNECTION_ID() names the proxy's backend "
        "connection, so this process stamps no owner connection on its claims (peers judge "
        "them by lease: LEASE_SECONDS), judges others' claims by lease alone, polls instead "
        "of waiting for wake-ups, and sends no KILL QUERY. Set MYSQLQ['LIVENESS'] = "
        "'lease' and MYSQLQ['WAKEUP'] = False to say so, or MYSQLQ['DETECT_PROXY'] = False "
        "if this relay keeps one server connection per client connection (an SSH tunnel).",
        seen_as, ours)
