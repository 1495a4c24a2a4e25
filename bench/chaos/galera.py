"""The Galera cluster of ``bench/cluster/galera.sh`` for ``--galera`` runs: its nodes' ports,
and the kill -9 and restart of one node."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .admin import HarnessError

SCRIPT = Path(__file__).resolve().parents[1] / "cluster" / "galera.sh"
#: Node number -> client port (the script's layout).
PORTS = {1: 4306, 2: 4307, 3: 4308}
#: The harness and the producers use node 1; workers the two others.
HARNESS_PORT = PORTS[1]
WORKER_PORTS = (PORTS[2], PORTS[3])


def _script(*args: str, timeout: float = 300) -> str:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise HarnessError(f"galera.sh {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def start_cluster() -> str:
    """Start the cluster if it isn't running; its status lines once all nodes are Synced."""
    return _script("start")


def node_of(port: int) -> int:
    return next(node for node, node_port in PORTS.items() if node_port == port)


def kill_node(port: int) -> float:
    """kill -9 of the node on ``port``; when the kill was sent (host epoch seconds)."""
    at = time.time()
    _script("kill", str(node_of(port)))
    return at


def start_node(port: int) -> float:
    """Start that node again and wait until it is Synced; when it was."""
    _script("start-node", str(node_of(port)))
    return time.time()
