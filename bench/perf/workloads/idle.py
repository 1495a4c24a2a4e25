"""Idle load: what idle workers cost the server, in statements per second each.

The workers connect through :class:`~bench.perf.proxy.CountingProxy`, which counts the
commands they send: exact, whatever else the (shared) server is doing. The server-wide
``Questions`` delta over the same window is kept in the details for comparison; it
includes every other session. Also timed: SIGTERM to exit of the idle worker(s).
"""

from __future__ import annotations

import time

from django.conf import settings

from .. import db
from ..context import Context, mode_env
from ..errors import BenchError
from ..proxy import CountingProxy
from ..workers import WorkerProcess, worker_args


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    conf = settings.DATABASES["default"]
    proxy = CountingProxy(conf["HOST"], int(conf["PORT"]))
    try:
        for repeat in range(ctx.repeat):
            for processes, mode in sizes.idle_cases:
                measure(ctx, proxy, processes, mode, repeat)
    finally:
        proxy.close()


def measure(ctx: Context, proxy: CountingProxy, processes: int, mode: str,
            repeat: int) -> None:
    sizes = ctx.sizes
    db.truncate_queue(ctx.conn)
    watch = ctx.watch()
    env = {**mode_env(mode), "MYSQLQ_BENCH_HOST": "127.0.0.1",
           "MYSQLQ_BENCH_PORT": str(proxy.port)}
    worker = WorkerProcess(worker_args(sizes.idle_threads, processes), ctx.log_dir,
                           f"idle-{mode}-{processes}-r{repeat}", env=env)
    ctx.wait_registered(worker, processes)
    time.sleep(sizes.idle_settle_seconds)
    before, statements_before = proxy.snapshot()
    questions_before = db.global_status(ctx.conn, "Questions")["Questions"]
    started = time.monotonic()
    time.sleep(sizes.idle_seconds)
    after, statements_after = proxy.snapshot()
    questions_after = db.global_status(ctx.conn, "Questions")["Questions"]
    elapsed = time.monotonic() - started
    stopping = time.monotonic()
    worker.stop()
    stop_s = time.monotonic() - stopping
    watch.check()
    if proxy.tls_seen:
        raise BenchError("idle: the workers' connections use TLS, which the counting proxy "
                         "can't read; connect without TLS to measure idle load.")
    sent = after - before
    statements = statements_after - statements_before
    per_worker = sent["COM_QUERY"] / elapsed / processes
    case = f"{processes} proc x{sizes.idle_threads} {mode}"
    fig = ctx.results.figure("idle", case, "queries/s per worker", "q/s")
    fig.add(per_worker, repeat=repeat, commands={k: v for k, v in sent.items() if v},
            statements=dict(statements.most_common(12)), window_s=round(elapsed, 2),
            server_questions_per_s=round((questions_after - questions_before) / elapsed, 1))
    fig.note = (f"COM_QUERY counted at a proxy over {sizes.idle_seconds:.0f}s; "
                f"{_others(sent, elapsed, processes)}")
    ctx.results.figure("idle", case, "SIGTERM to exit", "s",
                       note="graceful stop of the idle worker(s)").add(stop_s)
    ctx.log(f"idle {case}: {per_worker:.2f} queries/s per worker; stop took {stop_s:.1f}s")


def _others(sent: dict[str, int], elapsed: float, processes: int) -> str:
    other = {k: v for k, v in sent.items() if k != "COM_QUERY" and v}
    if not other:
        return "no other commands"
    return ", ".join(f"{k} {v / elapsed / processes:.2f}/s" for k, v in sorted(other.items()))
