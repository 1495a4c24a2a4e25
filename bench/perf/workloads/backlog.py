"""Backlog scaling: does the burn-down rate hold with a big queue or a big history?

Three tables states, each drained by the same worker (``--max-tasks``: the first
``backlog_drain`` messages only): a small ready backlog, a large one, and the small one
beside a large ``mysqlq_attempt``. Pre-fills are server-side ``INSERT … SELECT`` from the
sequence engine; their duration is reported. Each case also times plain claim+read+delete
cycles of one row (the raw statements) on the same table, to see the claim's own cost.

Both the drain and the probe are bounded in time (``backlog_drain_seconds``,
``backlog_probe_seconds``): a claim whose cost grows with the backlog (seconds per claim
at 1M rows) must show up as a low rate, not as a run that never ends.
"""

from __future__ import annotations

import time
import uuid

from .. import db
from ..context import DEFAULT_QUEUE, Context
from ..errors import BenchError
from ..workers import WorkerProcess, worker_args
from .raw import LEASE_MICROS, READ_SQL, SERVER_START, WORKER_ID, claim_statement


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    small, large, history = sizes.backlog_small, sizes.backlog_large, sizes.backlog_history
    per_repeat = sizes.backlog_drain + sizes.backlog_probe
    if small < per_repeat or large < per_repeat * ctx.repeat:
        raise BenchError(
            f"backlog: each repeat takes up to {per_repeat:,} rows (backlog_drain + "
            f"backlog_probe) and the large table is not refilled between repeats: give "
            f"backlog_small >= {per_repeat:,} and --backlog-rows >= {per_repeat * ctx.repeat:,}"
            ", or lower backlog_drain.")
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
    probe_ms, probe_cycles = _probe(ctx)
    hll_before, _ = ctx.wait_for_purge()
    after_id = ctx.max_attempt_id()
    watch = ctx.watch()
    worker = WorkerProcess(
        worker_args(threads, 1, sizes.backlog_batch, max_tasks=sizes.backlog_drain),
        ctx.log_dir, f"backlog-{case.replace(' ', '-')}-r{repeat}")
    finished = worker.wait_or_stop(sizes.backlog_drain_seconds, check=watch.check)
    watch.check()
    done, seconds = ctx.attempts_window(after_id)
    if finished and done != sizes.backlog_drain:
        raise BenchError(f"backlog {case}: {done} of {sizes.backlog_drain} succeeded")
    if not done:
        raise BenchError(f"backlog {case}: no task finished within "
                         f"{sizes.backlog_drain_seconds:.0f}s")
    rate = done / seconds if seconds > 0 else float("nan")
    fig = ctx.results.figure("backlog", case, "tasks/s", "tasks/s",
                             raw_ref=f"raw/claim_ack_{sizes.backlog_batch}/rows/s")
    fig.add(rate, repeat=repeat, prefill_s=round(fill_s, 2), hll_before=hll_before,
            hll_after=db.history_list_length(ctx.conn), drained=done, stopped_early=not finished,
            probe_cycles=probe_cycles)
    cut = sum(1 for d in fig.details if d["stopped_early"])
    fig.note = (f"{threads}x{processes} b{sizes.backlog_batch}, first "
                f"{sizes.backlog_drain:,} drained; pre-fill {fill_s:.1f}s"
                + (f"; STOPPED after {sizes.backlog_drain_seconds:g}s in {cut} repeat(s): "
                   "rate from what finished" if cut else ""))
    ctx.results.figure("backlog", case, "claim 1 row (raw)", "ms",
                       note=f"mean of up to {sizes.backlog_probe} raw claim+read+delete "
                            f"cycles (at most {sizes.backlog_probe_seconds:.0f}s)"
                       ).add(probe_ms, cycles=probe_cycles)
    ctx.log(f"backlog {case}: {rate:,.0f} tasks/s{' (stopped early)' if not finished else ''}"
            f"; raw 1-row cycle {probe_ms:.2f} ms over {probe_cycles} cycles")


def _probe(ctx: Context) -> tuple[float, int]:
    """``(mean ms, cycles)`` of raw 1-row claim+read+delete cycles on the table as it is."""
    cur = ctx.conn.cursor()
    started = time.perf_counter()
    deadline = started + ctx.sizes.backlog_probe_seconds
    cycles = 0
    claim_sql = claim_statement(ctx)
    while cycles < ctx.sizes.backlog_probe and (not cycles or time.perf_counter() < deadline):
        token = uuid.uuid4().hex
        cur.execute(claim_sql, [token, True, SERVER_START, WORKER_ID, LEASE_MICROS,
                                DEFAULT_QUEUE, 1])
        cur.execute(READ_SQL, [token])
        row = cur.fetchone()
        if row is None:
            break
        cur.execute("DELETE FROM mysqlq_message WHERE id = %s", [row[0]])
        cycles += 1
    if not cycles:
        raise BenchError("backlog: the probe found no ready message to claim")
    return (time.perf_counter() - started) / cycles * 1000, cycles
