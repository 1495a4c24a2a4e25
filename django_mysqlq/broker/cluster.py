"""Is the server a node of a Galera cluster? Then what a connection sees is its node's.

On MariaDB Galera Cluster (and Percona XtraDB Cluster) every node has its own connection
ids, process list, ``KILL``, ``Uptime`` and named locks (``GET_LOCK``), while the tables
are the cluster's. So on a cluster a claim carries no owner connection and peers judge it
by its lease alone; the recovery sweeper is named by a lease row (``broker.leader``); and a
producer wakes a parked worker on another node through that worker's row, whose lock the
parked worker holds (``broker.park``). A transaction that conflicts with one committed on
another node fails at ``COMMIT`` with a deadlock (1213, a certification conflict): the
broker retries its own transactions whole, as for any deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..conf import get_settings
from .base import logger

_warned = False


def node_of(status: Mapping[str, object]) -> str:
    """This node's identity from ``SHOW GLOBAL STATUS`` rows (lower-cased names), or ""
    when the server is no cluster node (no wsrep rows, or a cluster size of 0)."""
    try:
        size = int(str(status.get("wsrep_cluster_size") or 0))
    except ValueError:
        size = 0
    if size <= 0:
        return ""
    return str(status.get("wsrep_gcomm_uuid") or "") or "galera"


def warn_once(node: str, status: Mapping[str, object]) -> None:
    """Say once per process that the queue found a cluster and how it behaves there."""
    global _warned
    if _warned or get_settings().LIVENESS == "lease":
        return  # already said, or configured for it
    _warned = True
    logger.warning(
        "The queue database is a node of a Galera cluster (%s nodes; this connection is on "
        "node %s). Connection ids, the process list and named locks are per node, so this "
        "process judges claims by lease alone (a crashed worker's messages come back "
        "LEASE_SECONDS after its last heartbeat), names the recovery sweeper with a lease "
        "row instead of GET_LOCK, and wakes idle workers on other nodes through their rows. "
        "Set MYSQLQ['LIVENESS'] = 'lease' to say so.",
        status.get("wsrep_cluster_size"), node)
