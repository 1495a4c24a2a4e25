"""The short chaos run (``python -m bench.chaos --seconds 40``) as a test.

It starts its own workers on its own database (``mysqlq_chaos``), kills them (``kill -9``,
SIGTERM, ``KILL CONNECTION``) and restarts the shared MariaDB server once, then audits
what ran: nothing lost, every duplicate explained, atomic work exactly once, every topic
message handled by every consumer group (in key order) and heard by every live process.
The verdict and its evidence are in the JSON and in the run's output, shown when the
test fails.

``MYSQLQ_CHAOS_PORT`` (and ``MYSQLQ_CHAOS_SERVER``, ``…_PID_FILE``, ``…_SERVER_ARGS``:
see bench/chaos/server.py) point it at a private server: on a machine shared with other
users, never restart theirs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.worker, pytest.mark.harness]


def test_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    result_path = tmp_path / "chaos.json"
    env = {key: value for key, value in os.environ.items()
           if key != "DJANGO_SETTINGS_MODULE"}  # the run uses its own settings
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--seconds", "40", "--json", str(result_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    output = f"{run.stdout}\n{run.stderr}"
    assert result_path.exists(), output
    result = json.loads(result_path.read_text())
    assert result["metrics"]["lost"] == 0, output
    # Ordered, limited and rate-limited tasks ran through the same faults, in order and
    # within limits.
    metrics = result["metrics"]
    assert metrics["ordered_messages"] and metrics["limited_messages"], output
    assert metrics["rated_messages"], output
    assert (metrics["order_violations"], metrics["limit_violations"],
            metrics["rate_violations"]) == (0, 0, 0), output
    # The topic went through them too: every group handled every committed message, a
    # rolled-back one by none, and the broadcast reached the processes that lived on.
    assert metrics["topic_published"] and metrics["broadcast_owed"], output
    assert (metrics["topic_lost"], metrics["topic_rolled_back_seen"],
            metrics["topic_order_violations"], metrics["broadcast_missed"]) == (0, 0, 0, 0), output
    assert run.returncode == 0, output
