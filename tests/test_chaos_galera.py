"""The short chaos run on the 3-node Galera cluster (``python -m bench.chaos --galera
--seconds 40``) as a test.

Producers on node 1, workers on nodes 2 and 3, kill -9 and SIGTERM of workers, KILL
CONNECTION on their own node, a crashing task, a locked row, and a kill -9 of the database
node most workers use, which rejoins while the load goes on. Then the audit: nothing lost,
every duplicate explained, atomic work exactly once, kill -9 orphans claimed again within
the lease + two sweep intervals + 2 s (median). The server on 3306 is not touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import galera_support as galera

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.worker, pytest.mark.galera, pytest.mark.harness]


def test_short_chaos_run_on_the_cluster_loses_nothing(tmp_path: Path) -> None:
    if not galera.PROVIDER.exists():
        pytest.skip("galera-4 is not installed (bash .ci/setup installs it)")
    result_path = tmp_path / "chaos.json"
    env = {key: value for key, value in os.environ.items()
           if key != "DJANGO_SETTINGS_MODULE"}  # the run uses its own settings
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--galera", "--seconds", "40",
         "--json", str(result_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    output = f"{run.stdout}\n{run.stderr}"
    assert result_path.exists(), output
    result = json.loads(result_path.read_text())
    metrics = result["metrics"]
    assert metrics["lost"] == 0, output
    assert metrics["node_kills"] == 1, output
    assert run.returncode == 0, output
    print(f"enqueued {metrics['enqueued']}, lost 0; kill -9 recovery median "
          f"{metrics['recovery_median_seconds']} s; node kill recovery median "
          f"{metrics['node_recovery_median_seconds']} s; node back after "
          f"{metrics['node_down_seconds']} s")
