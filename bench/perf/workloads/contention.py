"""Claim contention: 1, 2, 4, 8 processes claiming and acking from one queue at once.

Each claimer is a forked process (no shared GIL) running ``broker.claim`` then
``broker.ack_many`` on its own connection until the queue is empty. Reported: rows/s
from the first claimer's start to the last one's end, the deadlocks and lock wait
timeouts the broker retried (``broker.stats``, summed over the claimers), and the
server's ``Innodb_row_lock_waits`` / ``Innodb_deadlocks`` deltas (server-wide).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from typing import Any

from django.db import connections

from django_mysqlq import broker
from django_mysqlq.messages import AttemptResult, Runner

from .. import db
from ..context import Context
from ..errors import BenchError

QUEUE = "contend"


def _claimer(index: int, batch: int, seconds: float, go: Any, out: Any) -> None:
    """Body of one forked claimer (the parent closed its connections before the fork)."""
    broker.stats.deadlocks = broker.stats.lock_waits = 0
    worker_id = f"bench:claimer:{os.getpid()}"
    runner = Runner(worker_id=worker_id, host="bench", pid=os.getpid(), thread=f"c{index}")
    try:
        broker.connection_identity()  # connect before the start signal
        out.put(("ready", index))
        go.wait()
        started, moved, stopped = time.monotonic(), 0, False
        while messages := broker.claim([QUEUE], batch, worker_id, 60.0):
            now = broker.database_now()
            broker.ack_many([(m, runner, AttemptResult(started_at=now)) for m in messages])
            moved += len(messages)
            if time.monotonic() - started > seconds:
                stopped = True
                break
        out.put(("done", {"started": started, "ended": time.monotonic(), "moved": moved,
                          "stopped": stopped,
                          "deadlocks": broker.stats.deadlocks,
                          "lock_waits": broker.stats.lock_waits}))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        connections.close_all()


def _total(details: list[dict[str, Any]], key: str) -> int:
    return sum(int(d[key]) for d in details)


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    for repeat in range(ctx.repeat):
        for claimers in sizes.contention_claimers:
            measure(ctx, claimers, repeat)


def _collect(out: Any, kind: str, count: int, timeout: float) -> list[Any]:
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(found) < count:
        try:
            tag, value = out.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise BenchError(f"contention: {len(found)} of {count} claimers reported "
                             f"'{kind}' within {timeout:.0f}s") from None
        if tag == "error":
            raise BenchError(f"contention: a claimer failed: {value}")
        found.append(value)
    return found


def measure(ctx: Context, claimers: int, repeat: int) -> None:
    sizes = ctx.sizes
    db.truncate_queue(ctx.conn)
    ctx.fill_ready(sizes.contention_backlog, queue=QUEUE)
    watch = ctx.watch()
    connections.close_all()  # never share a connection with the forked children
    fork = multiprocessing.get_context("fork")
    go, out = fork.Event(), fork.Queue()
    args = (sizes.contention_batch, sizes.contention_seconds, go, out)
    processes = [fork.Process(target=_claimer, args=(i, *args), daemon=True)
                 for i in range(claimers)]
    for process in processes:
        process.start()
    try:
        _collect(out, "ready", claimers, 30)
        before = db.global_status(ctx.conn, "Innodb_deadlocks", "Innodb_row_lock_waits")
        go.set()
        reports = _collect(out, "done", claimers, 60 + sizes.contention_seconds)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    after = db.global_status(ctx.conn, "Innodb_deadlocks", "Innodb_row_lock_waits")
    watch.check()
    moved = sum(r["moved"] for r in reports)
    stopped = any(r["stopped"] for r in reports)
    if moved != sizes.contention_backlog and not stopped:
        raise BenchError(f"contention: moved {moved} of {sizes.contention_backlog}")
    seconds = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    case = f"{claimers} claimer{'s' if claimers > 1 else ''} b{sizes.contention_batch}"
    batch = sizes.contention_batch
    raw_ref = f"raw/claim_ack_{batch}/rows/s" if batch in (10, 100) else None
    waits = after["Innodb_row_lock_waits"] - before["Innodb_row_lock_waits"]
    deadlocks = after["Innodb_deadlocks"] - before["Innodb_deadlocks"]
    retried_deadlocks = sum(r["deadlocks"] for r in reports)
    retried_timeouts = sum(r["lock_waits"] for r in reports)
    fig = ctx.results.figure("contention", case, "rows/s", "rows/s", raw_ref=raw_ref)
    fig.add(moved / seconds, repeat=repeat, innodb_row_lock_waits=waits,
            innodb_deadlocks=deadlocks, deadlocks_retried=retried_deadlocks,
            lock_wait_timeouts_retried=retried_timeouts, moved=moved, stopped_early=stopped)
    fig.note = (f"claim+ack_many over {sizes.contention_backlog:,} rows; deadlocks (server) "
                f"{_total(fig.details, 'innodb_deadlocks')}, retried by the broker: deadlocks "
                f"{_total(fig.details, 'deadlocks_retried')}, lock wait timeouts "
                f"{_total(fig.details, 'lock_wait_timeouts_retried')} (sums of all repeats)"
                + (f"; STOPPED after {sizes.contention_seconds:g}s in "
                   f"{_total(fig.details, 'stopped_early')} repeat(s)"
                   if _total(fig.details, "stopped_early") else ""))
    ctx.results.figure("contention", case, "Innodb_row_lock_waits", "count",
                       note="server-wide delta (the server is shared)").add(waits)
    counters = {"row lock waits": waits, "deadlocks": deadlocks,
                "retried": retried_deadlocks + retried_timeouts}
    ctx.log(f"contention {case}: {moved / seconds:,.0f} rows/s, {counters}")
