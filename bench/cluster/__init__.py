"""The 3-node MariaDB Galera cluster of ``galera.sh`` beside this file: its layout, and the
script run from Python (the tests, ``bench.chaos --galera``, ``bench.perf``'s ``cluster``
workload)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "galera.sh"
#: The wsrep provider (Debian's galera-4): without it there is no cluster to start.
PROVIDER = Path("/usr/lib/galera/libgalera_smm.so")
#: Node number -> client port on 127.0.0.1 (root, no password, as on the main server).
PORTS = {1: 4306, 2: 4307, 3: 4308}


class ClusterError(RuntimeError):
    """``galera.sh`` failed; the message has the end of what it said."""


def script(*args: str, timeout: float = 300) -> str:
    """Run ``galera.sh`` with these arguments; its standard output."""
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        said = f"{done.stdout}\n{done.stderr}".strip()[-2000:]
        raise ClusterError(f"galera.sh {' '.join(args)} failed ({done.returncode}): {said}")
    return done.stdout


def node_of(port: int) -> int:
    return next(node for node, node_port in PORTS.items() if node_port == port)
