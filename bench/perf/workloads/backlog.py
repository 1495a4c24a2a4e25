"""Backlog scaling: does the burn-down rate hold with a big queue or a big history?

Three tables states, each drained by the same worker (``--max-tasks``: the first
``backlog_drain`` messages only): a small ready backlog, a large one, and the small one
beside a large ``mysqlq_attempt``. Pre-fills are server-side ``INSERT … SELECT`` from the
sequence engine; their duration is reported. Each case also times plain claim+read+delete
cycles of one row (the raw statements) on the same table, to see the claim's own cost.
"""

from __future__ import annotations

import time
import uuid

from .. import db
from ..context import DEFAULT_QUEUE, Context
from ..errors import BenchError
from ..workers import WorkerProcess, worker_args
from .raw import CLAIM_SQL, LEASE_MICROS, READ_SQL, SERVER_START, WORKER_ID


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    small, large, history = sizes.backlog_small, sizes.backlog_large, sizes.backlog_history
    cases = (
        (f"ready {_k(small)}", 0, small, True),
        (f"ready {_k(large)}", 0, large, False),
        (f"ready {_k(small)} + history {_k(history)}", history, small, True),
    )
    for case, history_rows, ready_rows, refill in cases:
        db.truncate_queue(ctx.conn)
        fill_s = ctx.fill_history(history_rows) if history_rows else 0.0
        fill_s += ctx.fill_ready(ready_rows)
        ctx.log(f"backlog {case}: pre-filled in {fill_s:.1f}s")
        for repeat in range(ctx.repeat):
            if refill and repeat:
                ctx.conn.cursor().execute("DELETE FROM mysqlq_message")
                ctx.fill_ready(ready_rows)
            drain(ctx, case, repeat, fill_s)


def _k(count: int) -> str:
    return f"{count // 1_000_000}M" if count >= 1_000_000 else f"{count // 1000}k" \
        if count >= 1000 else str(count)


def drain(ctx: Context, case: str, repeat: int, fill_s: float) -> None:
    sizes = ctx.sizes
    threads, processes = sizes.backlog_shape
    if processes != 1:
        raise ValueError("backlog_shape must be one process: --max-tasks ends it")
    probe_ms = _probe(ctx)
    hll_before, _ = ctx.wait_for_purge()
    after_id = ctx.max_attempt_id()
    watch = ctx.watch()
    worker = WorkerProcess(
        worker_args(threads, 1, sizes.backlog_batch, max_tasks=sizes.backlog_drain),
        ctx.log_dir, f"backlog-{case.replace(' ', '-')}-r{repeat}")
    worker.wait(timeout=120 + sizes.backlog_drain / 100, check=watch.check)
    watch.check()
    done, seconds = ctx.attempts_window(after_id)
    if done != sizes.backlog_drain:
        raise BenchError(f"backlog {case}: {done} of {sizes.backlog_drain} succeeded")
    rate = done / seconds
    fig = ctx.results.figure("backlog", case, "tasks/s", "tasks/s",
                             raw_ref=f"raw/claim_ack_{sizes.backlog_batch}/rows/s")
    fig.add(rate, repeat=repeat, prefill_s=round(fill_s, 2), hll_before=hll_before,
            hll_after=db.history_list_length(ctx.conn))
    fig.note = (f"{threads}x{processes} b{sizes.backlog_batch}, first "
                f"{sizes.backlog_drain:,} drained; pre-fill {fill_s:.1f}s")
    ctx.results.figure("backlog", case, "claim 1 row (raw)", "ms",
                       note=f"mean of {sizes.backlog_probe} raw claim+read+delete cycles"
                       ).add(probe_ms)
    ctx.log(f"backlog {case}: {rate:,.0f} tasks/s; raw 1-row cycle {probe_ms:.2f} ms")


def _probe(ctx: Context) -> float:
    """Mean milliseconds of a raw 1-row claim+read+delete cycle on the table as it is."""
    cur = ctx.conn.cursor()
    started = time.perf_counter()
    cycles = ctx.sizes.backlog_probe
    for _ in range(cycles):
        token = uuid.uuid4().hex
        cur.execute(CLAIM_SQL, [token, SERVER_START, WORKER_ID, LEASE_MICROS, DEFAULT_QUEUE, 1])
        cur.execute(READ_SQL, [token])
        row = cur.fetchone()
        cur.execute("DELETE FROM mysqlq_message WHERE id = %s", [row[0]])
    return (time.perf_counter() - started) / cycles * 1000
