"""The run's outputs: one JSON file with everything, one markdown table of medians."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .config import ALL_WORKLOADS

_TITLES = {
    "raw": "Raw floor (plain MySQLdb, same statements, one connection)",
    "enqueue": "Enqueue through the library",
    "burndown": "Burn-down of pre-filled no-op tasks (`runqueueworker --burst`), "
                "case = threads x processes, claim batch, size",
    "latency": "Pickup latency (task start - enqueue commit) at a fixed producer rate",
    "idle": "Idle load on the server",
    "backlog": "Backlog scaling",
    "contention": "Claim contention (forked claimers: broker.claim + ack_many)",
    "cluster": "Burn-down on the single server and on the 3-node Galera cluster, same run "
               "(queue filled on node 1, one worker process on each of nodes 2 and 3)",
    "ordered": "Ordered subjects and concurrency limits: burn-downs with and without gates",
    "streams": "Topics: publish, consumer groups draining, pickup latency, lag under load",
}
_SERVER_KEYS = ("innodb_flush_log_at_trx_commit", "innodb_buffer_pool_size", "log_bin",
                "binlog_format", "sync_binlog", "transaction_isolation",
                "innodb_purge_threads")
_SETTING_KEYS = ("WAKEUP", "BATCH_SIZE", "ACK_BATCH_SIZE", "ACK_DELAY_SECONDS", "POLL_SECONDS",
                 "HEARTBEAT_SECONDS", "RECOVERY_SECONDS", "LIVENESS")


def number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _server_line(server: dict[str, str]) -> str:
    parts = []
    for key in _SERVER_KEYS:
        if key in server:
            value = server[key]
            if key == "innodb_buffer_pool_size":
                value = f"{int(value) // 2**20} MiB"
            parts.append(f"`{key}={value}`")
    return ", ".join(parts)


def markdown(run: dict[str, Any]) -> str:
    m, v = run["machine"], run["versions"]
    dirty = " (+ uncommitted changes)" if v.get("django_mysqlq_dirty") else ""
    settings = run["settings"]["MYSQLQ"]
    lines = [
        f"# django-mysqlq benchmark {run['run_id']} ({run['mode']})",
        "",
        f"- Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB",
        f"- Versions: Python {v['python']}, Django {v['django']}, mysqlclient "
        f"{v['mysqlclient']}, MariaDB {v['mariadb']}, django-mysqlq "
        f"`{str(v['django_mysqlq_commit'])[:10]}`{dirty}",
        f"- Server: {_server_line(run['server'])}",
        "- Queue settings: " + ", ".join(
            f"`{k}={settings[k]}`" for k in _SETTING_KEYS if k in settings),
        f"- Repeats: {run['settings']['repeat']}; figures are medians, range is min-max; "
        "`vs raw` = median / median of the matching raw figure of this run.",
        f"- Duration: {run['duration_s']:.0f} s"
        + "".join(f", {name} {sec:.0f} s" for name, sec in run.get("workload_seconds", {}).items()),
        f"- Command: `{run.get('command', 'python -m bench.perf')}`; every size is in the JSON "
        "(`settings.sizes`).",
    ]
    for retry in run.get("retried", []):
        lines.append(f"- Measured again after a server restart: {retry['workload']} "
                     f"({retry['reason']})")
    if run.get("error"):
        lines += ["", f"**Run stopped: {run['error']}**"]
    for workload in ALL_WORKLOADS:
        rows = [r for r in run["results"] if r["workload"] == workload]
        if not rows:
            continue
        lines += ["", f"## {_TITLES[workload]}", "",
                  "| case | metric | median | unit | range (n) | vs raw | notes |",
                  "| --- | --- | ---: | --- | --- | ---: | --- |"]
        for r in rows:
            spread = f"{number(r['min'])}..{number(r['max'])} ({len(r['values'])})"
            ratio = f"{r['ratio_to_raw']:.2f}" if r["ratio_to_raw"] is not None else ""
            lines.append(f"| {r['case']} | {r['metric']} | {number(r['median'])} | "
                         f"{r['unit']} | {spread} | {ratio} | {r['note']} |")
    for plot in run.get("plots", []):
        lines += ["", f"![{plot}]({plot})"]
    return "\n".join(lines) + "\n"


def write(run: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"perf-{run['run_id']}"
    json_path = out_dir / f"{stem}.json"
    md_path = out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(run, indent=2, default=str) + "\n")
    md_path.write_text(markdown(run))
    return json_path, md_path
