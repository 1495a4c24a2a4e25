"""Idle load: what idle workers cost the server, in queries per second each.

Two counts over the same window. The issue's: the server-wide ``SHOW GLOBAL STATUS``
``Questions`` delta, minus the harness's own statements (its session counter), minus
what other sessions sent in a baseline window just before, with no worker running; on
a quiet server that is the workers' load, on a shared one it is noisy. And an exact
one: the workers connect through :class:`~bench.perf.proxy.CountingProxy`, which counts
the commands they send whatever else the server is doing. Also timed: SIGTERM to exit.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings

from .. import db
from ..context import Context, mode_env
from ..errors import BenchError
from ..proxy import CountingProxy
from ..workers import WorkerProcess, worker_args


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    conf: dict[str, Any] = settings.DATABASES["default"]
    proxy = CountingProxy(conf["HOST"], int(conf["PORT"]))
    try:
        for repeat in range(ctx.repeat):
            for processes, mode in sizes.idle_cases:
                measure(ctx, proxy, processes, mode, repeat)
    finally:
        proxy.close()


def _questions(ctx: Context) -> tuple[int, int]:
    """``(server-wide Questions, this session's Questions)``, in that order."""
    server = db.global_status(ctx.conn, "Questions")["Questions"]
    return server, db.session_questions(ctx.conn)


def _others_rate(ctx: Context, seconds: float) -> float:
    """Questions/s the server gets from everyone but the harness, with no worker running."""
    before, own_before = _questions(ctx)
    started = time.monotonic()
    time.sleep(seconds)
    after, own_after = _questions(ctx)
    return (after - before - _own(own_before, own_after)) / (time.monotonic() - started)


def _own(session_before: int, session_after: int) -> int:
    """The harness's statements in the server-wide delta between two ``_questions`` calls.

    That delta holds our first session read, whatever we sent in between and our second
    global read; the session delta holds the same count, shifted by one statement (the
    second session read instead of the first), so the two are equal.
    """
    return session_after - session_before


def measure(ctx: Context, proxy: CountingProxy, processes: int, mode: str,
            repeat: int) -> None:
    sizes = ctx.sizes
    db.truncate_queue(ctx.conn)
    watch = ctx.watch()
    others = _others_rate(ctx, sizes.idle_baseline_seconds)
    env = {**mode_env(mode), "MYSQLQ_BENCH_HOST": "127.0.0.1",
           "MYSQLQ_BENCH_PORT": str(proxy.port), "MYSQLQ_BENCH_DETECT_PROXY": "0"}
    worker = WorkerProcess(worker_args(sizes.idle_threads, processes), ctx.log_dir,
                           f"idle-{mode}-{processes}-r{repeat}", env=env)
    ctx.wait_registered(worker, processes)
    time.sleep(sizes.idle_settle_seconds)
    before, statements_before = proxy.snapshot()
    questions_before, own_before = _questions(ctx)
    started = time.monotonic()
    time.sleep(sizes.idle_seconds)
    after, statements_after = proxy.snapshot()
    questions_after, own_after = _questions(ctx)
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
    if mode == "wakeup" and not any(shape.startswith("SELECT CASE") for shape in statements):
        # Polling workers cost ~6 statements/s each: a figure for the wrong mode.
        raise BenchError(f"idle: the {mode} workers never parked (no park statement at the "
                         f"relay; seen: {dict(statements.most_common(6))}); was the relay "
                         "taken for a proxy?")
    own = _own(own_before, own_after)
    server_rate = (questions_after - questions_before - own) / elapsed
    per_worker = (server_rate - others) / processes
    exact = sent["COM_QUERY"] / elapsed / processes
    case = f"{processes} proc x{sizes.idle_threads} {mode}"
    fig = ctx.results.figure("idle", case, "queries/s per worker", "q/s")
    fig.add(per_worker, repeat=repeat, window_s=round(elapsed, 2),
            server_questions_per_s=round(server_rate, 2),
            others_questions_per_s=round(others, 2), harness_statements=own)
    fig.note = (f"SHOW GLOBAL STATUS Questions over {sizes.idle_seconds:.0f}s, minus the "
                f"harness's own statements, minus the rate of other sessions measured for "
                f"{sizes.idle_baseline_seconds:.0f}s before (median "
                f"{_median(fig.details, 'others_questions_per_s'):.1f}/s): noisy on a "
                "shared server, compare with the proxy count")
    proxied = ctx.results.figure("idle", case, "statements/s per worker (proxy)", "q/s")
    proxied.add(exact, repeat=repeat, commands={k: v for k, v in sent.items() if v},
                statements=dict(statements.most_common(12)))
    proxied.note = (f"COM_QUERY counted at a TCP relay in front of the workers: exact; "
                    f"{_others(sent, elapsed, processes)}")
    ctx.results.figure("idle", case, "SIGTERM to exit", "s",
                       note="graceful stop of the idle worker(s)").add(stop_s)
    ctx.log(f"idle {case}: {per_worker:.2f} queries/s per worker (Questions; others "
            f"{others:.1f}/s), {exact:.2f} exact at the proxy; stop took {stop_s:.1f}s")


def _median(details: list[dict[str, float]], key: str) -> float:
    values = sorted(float(d[key]) for d in details)
    return values[len(values) // 2]


def _others(sent: dict[str, int], elapsed: float, processes: int) -> str:
    other = {k: v for k, v in sent.items() if k != "COM_QUERY" and v}
    if not other:
        return "no other commands"
    return ", ".join(f"{k} {v / elapsed / processes:.2f}/s" for k, v in sorted(other.items()))
