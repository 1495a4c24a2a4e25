"""The Galera cluster of ``bench/cluster/galera.sh`` for ``--galera`` runs: which nodes the
harness and the workers use, and the kill -9 and restart of one node."""

from __future__ import annotations

import time

from bench.cluster import PORTS, ClusterError, node_of, script

from .admin import HarnessError

__all__ = ["HARNESS_PORT", "WORKER_PORTS", "kill_node", "node_of", "start_cluster",
           "start_node"]

#: The harness and the producers use node 1; workers the two others.
HARNESS_PORT = PORTS[1]
WORKER_PORTS = (PORTS[2], PORTS[3])


def _script(*args: str) -> str:
    try:
        return script(*args)
    except ClusterError as exc:
        raise HarnessError(str(exc)) from exc


def start_cluster() -> str:
    """Start the cluster if it isn't running; its status lines once all nodes are Synced."""
    return _script("start")


def kill_node(port: int) -> float:
    """kill -9 of the node on ``port``; when the kill was sent (host epoch seconds)."""
    at = time.time()
    _script("kill", str(node_of(port)))
    return at


def start_node(port: int) -> float:
    """Start that node again and wait until it is Synced; when it was."""
    _script("start-node", str(node_of(port)))
    return time.time()
