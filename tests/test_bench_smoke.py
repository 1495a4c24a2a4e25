"""The benchmark harness runs end to end (``python -m bench.perf --smoke``).

Only that it works and writes sane files: a number for every workload, the plots, the
machine and settings. Speeds are never asserted here (they live in the benchmark's own
output, measured on a quiet machine).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.perf.config import WORKLOADS

pytestmark = [pytest.mark.worker, pytest.mark.harness]

ROOT = Path(__file__).resolve().parent.parent
#: The figure each workload must report, as (metric).
KEY_METRICS = {
    "raw": "rows/s", "enqueue": "msgs/s", "burndown": "tasks/s", "latency": "p50",
    "idle": "queries/s per worker", "backlog": "tasks/s", "contention": "rows/s",
    "ordered": "tasks/s", "streams": "msgs/s",
}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def test_smoke_benchmark_reports_every_workload(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DJANGO_SETTINGS_MODULE"] = "bench.perf.settings"
    env["MYSQLQ_BENCH_DB"] = "mysqlq_bench_smoke"  # never a full run's database
    _drop_database("mysqlq_bench_smoke")  # made afresh: nothing an older run left matters
    proc = subprocess.run(
        [sys.executable, "-m", "bench.perf", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"

    [json_path] = tmp_path.glob("perf-*.json")
    run = json.loads(json_path.read_text())
    assert run["error"] is None
    assert run["mode"] == "smoke"
    assert run["workloads"] == list(WORKLOADS)
    for section in ("machine", "versions", "server", "settings"):
        assert run[section], section
    assert set(KEY_METRICS) == set(WORKLOADS)
    for workload, metric in KEY_METRICS.items():
        figures = [r for r in run["results"]
                   if r["workload"] == workload and r["metric"] == metric]
        assert figures, f"no {metric} figure for {workload}"
        for figure in figures:
            assert _number(figure["median"]), figure
            assert all(_number(value) for value in figure["values"]), figure
    ratios = [r["ratio_to_raw"] for r in run["results"] if r["raw_ref"]]
    assert ratios and all(_number(ratio) for ratio in ratios)
    by_key = {(r["workload"], r["case"], r["metric"]): r for r in run["results"]}
    for (workload, case, metric), figure in by_key.items():
        if workload == "latency" and metric == "p50":  # percentiles of one sample, in order
            p95, p99 = (by_key[(workload, case, m)]["median"] for m in ("p95", "p99"))
            assert figure["median"] <= p95 <= p99, case
        if workload == "burndown":  # purge lag is visible
            assert all(isinstance(d["hll_after"], int) for d in figure["details"]), case
    assert run["settings"]["sizes"]["backlog_large"] > run["settings"]["sizes"]["backlog_small"]
    markdown = json_path.with_suffix(".md").read_text()
    assert markdown.count("| case |") == len(WORKLOADS)
    assert sorted(run["plots"]) == sorted(p.name for p in tmp_path.glob("perf-*.png"))
    assert len(run["plots"]) == 2  # throughput by worker shape, latency percentiles
    for plot in run["plots"]:
        assert (tmp_path / plot).read_bytes().startswith(b"\x89PNG"), plot
        assert f"]({plot})" in markdown


def _drop_database(name: str) -> None:
    import MySQLdb
    from django.conf import settings

    conf = settings.DATABASES["default"]
    conn = MySQLdb.connect(host=conf["HOST"], port=int(conf["PORT"]), user=conf["USER"],
                           password=conf["PASSWORD"])
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()
