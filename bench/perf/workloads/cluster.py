"""Cluster burn-down: one pre-filled burn-down on the single server and on the Galera
cluster, in the same run, with the same workers.

Each repeat burns ``cluster_size`` no-op messages twice with two ``runqueueworker --burst``
processes of ``cluster_threads`` threads and claim batch ``cluster_batch``: first both on the
main server, then on the 3-node cluster of ``bench/cluster/galera.sh`` (started if needed),
the queue filled on node 1 and one process on each of nodes 2 and 3, so every claim and ack
is certified across the cluster. Rated like ``burndown``: succeeded attempts over first start
to last finish. The cluster's three mariadbd run on this machine too: they share its cores
with the workers (a real cluster has a host per node), so the ratio is a floor.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import Any

import MySQLdb
from django.conf import settings

from bench.cluster import PORTS, PROVIDER, ClusterError, script

from .. import db
from ..context import Context
from ..errors import BenchError
from ..workers import ROOT, WorkerProcess, worker_args, worker_env

WORKLOAD = "cluster"
#: Longest wait for nodes 2 and 3 to have applied the pre-fill.
APPLY_PATIENCE = 60.0


def run(ctx: Context) -> None:
    if not PROVIDER.exists():
        ctx.log("cluster: galera-4 is not installed (bash .ci/setup installs it); skipped")
        return
    sizes = ctx.sizes
    node1 = _prepare_cluster()
    cluster = dataclasses.replace(ctx, conn=node1)
    try:
        for repeat in range(ctx.repeat):
            for where, target, ports in (("server", ctx, (None, None)),
                                         ("galera", cluster, (PORTS[2], PORTS[3]))):
                _burn(target, where, ports, sizes.cluster_size, sizes.cluster_threads,
                      sizes.cluster_batch, repeat)
    finally:
        db.truncate_queue(node1)
        node1.close()


def _prepare_cluster() -> Any:
    """Start the cluster (if it isn't running), create and migrate the bench database on
    it; a connection to node 1."""
    try:
        script("start")
    except ClusterError as exc:
        raise BenchError(f"Could not start the Galera cluster: {exc}") from exc
    name = settings.DATABASES["default"]["NAME"]
    args = {**db.connect_args(database=False), "port": PORTS[1]}
    conn = MySQLdb.connect(**args)
    conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")  # afresh, as on the server
    conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    conn.select_db(name)
    done = subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT,
                          env=worker_env(_node_env(PORTS[1])), capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        raise BenchError(f"migrate on the Galera cluster failed:\n{done.stderr[-3000:]}")
    return conn


def _node_env(port: int | None) -> dict[str, str]:
    return {} if port is None else {"MYSQLQ_BENCH_HOST": "127.0.0.1",
                                    "MYSQLQ_BENCH_PORT": str(port)}


def _applied_everywhere(ctx: Context, ports: tuple[int | None, ...], size: int) -> None:
    """Wait until every worker node sees the whole pre-fill (apply lag is short, not 0)."""
    deadline = time.monotonic() + APPLY_PATIENCE
    for port in {p for p in ports if p is not None}:
        conn = MySQLdb.connect(**{**db.connect_args(), "port": port})
        try:
            while db.scalar(conn, "SELECT COUNT(*) FROM mysqlq_message") < size:
                if time.monotonic() > deadline:
                    raise BenchError(f"node on port {port} did not apply the pre-fill "
                                     f"within {APPLY_PATIENCE:.0f}s")
                time.sleep(0.1)
        finally:
            conn.close()


#: Galera's counters of transactions that lost a conflict with another node's: failed
#: certification at commit, or aborted while running by a write-set being applied.
CONFLICT_COUNTERS = ("wsrep_local_cert_failures", "wsrep_local_bf_aborts")


def _conflicts(ports: tuple[int | None, ...]) -> int:
    """Those counters summed over the worker nodes (0 on the single server)."""
    total = 0
    for port in {p for p in ports if p is not None}:
        conn = MySQLdb.connect(**{**db.connect_args(), "port": port})
        try:
            total += sum(db.global_status(conn, *CONFLICT_COUNTERS).values())
        finally:
            conn.close()
    return total


def _retried(worker: WorkerProcess) -> int:
    """Deadlocks (certification conflicts among them) the worker retried: its summary."""
    try:
        return int(json.loads(worker.stdout().strip().splitlines()[-1])["deadlocks_retried"])
    except (IndexError, ValueError, KeyError, TypeError):
        return -1


def _burn(ctx: Context, where: str, ports: tuple[int | None, ...], size: int, threads: int,
          batch: int, repeat: int) -> None:
    db.truncate_queue(ctx.conn)
    prefill = ctx.fill_ready(size)
    _applied_everywhere(ctx, ports, size)
    conflicts_before = _conflicts(ports)
    case = f"{where} {threads}x{len(ports)} b{batch} n{size // 1000}k"
    workers = [WorkerProcess(worker_args(threads, 1, batch, burst=True), ctx.log_dir,
                             f"cluster-{where}-{index}-r{repeat}", env=_node_env(port))
               for index, port in enumerate(ports)]
    finished = all([worker.wait_or_stop(ctx.sizes.burndown_seconds) for worker in workers])
    done, seconds = ctx.attempts_window()
    left = ctx.message_count()
    conflicts = _conflicts(ports) - conflicts_before
    if finished and (done != size or left):
        raise BenchError(f"cluster burn-down {case}: {done} of {size} succeeded, {left} left")
    if not done:
        raise BenchError(f"cluster burn-down {case}: nothing finished")
    fig = ctx.results.figure(WORKLOAD, case, "tasks/s", "tasks/s",
                             raw_ref=f"raw/claim_ack_{batch}/rows/s")
    retried = [_retried(worker) for worker in workers]
    fig.add(done / seconds, repeat=repeat, prefill_s=round(prefill, 3), done=done,
            drain_s=round(seconds, 3), stopped_early=not finished,
            node_conflicts=conflicts, deadlocks_retried=retried)
    fig.note = (f"3 nodes on this host, workers on nodes 2 and 3; conflicts on the nodes "
                f"{_medians(fig.details, 'node_conflicts')}, retried by the workers "
                f"{_medians(fig.details, 'deadlocks_retried')}" if where == "galera"
                else "2 worker processes on the main server")
    ctx.log(f"cluster {case}: {done / seconds:,.0f} tasks/s; conflicts {conflicts}, "
            f"retried {retried}")


def _medians(details: list[dict[str, Any]], key: str) -> str:
    values = sorted(sum(d[key]) if isinstance(d[key], list) else d[key] for d in details)
    return str(values[len(values) // 2]) if values else "-"
