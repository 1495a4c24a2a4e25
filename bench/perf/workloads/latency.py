"""Pickup latency: a producer enqueues at a fixed rate while one worker process runs.

Arrivals are evenly spaced by default (``latency_arrivals = "fixed"``, the issue's
fixed rate); ``poisson`` draws exponential gaps (seeded) instead, since an even rhythm
can phase-lock with the worker's idle back-off, for better or worse.

Each message is enqueued in its own ``transaction.atomic()``; latency is the task's
start (``time.time_ns()`` in the task body) minus the commit, taken by an ``on_commit``
hook registered before the enqueue, so it runs right after COMMIT returns and before
the library's own wake-up hook: the wake-up's cost is inside the latency, as it is for
a user. Both clocks are this host's. Each rate runs in both modes (``wakeup``: idle
workers park in SQL and producers wake them; ``poll``: ``MYSQLQ['WAKEUP'] = False``). The
first
``latency_warmup_seconds`` are left out of the percentiles (their maximum is in the
details). A message not started within ``STRAGGLER_SECONDS`` after the producer's last
enqueue counts as infinitely late in the percentiles and is reported on its own line.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from pathlib import Path

from django.db import transaction

from .. import db
from ..benchapp.tasks import STAMP_DIR_ENV, stamp
from ..context import Context, harness_mode, mode_env
from ..errors import BenchError
from ..results import percentile
from ..workers import WorkerProcess, worker_args

STRAGGLER_SECONDS = 5.0


def run(ctx: Context) -> None:
    for repeat in range(ctx.repeat):
        for mode in ctx.sizes.latency_modes:
            for rate in ctx.sizes.latency_rates:
                with harness_mode(mode):
                    measure(ctx, rate, mode, repeat)


def _read_stamps(directory: Path) -> dict[int, int]:
    started: dict[int, int] = {}
    for path in directory.glob("stamp-*.log"):
        for line in path.read_text().splitlines():
            seq, _, start_ns = line.split()
            started[int(seq)] = int(start_ns)
    return started


def _produce(rate: int, count: int, seed: int, arrivals: str) -> tuple[list[int], float]:
    """Enqueue ``count`` stamps at ``rate``; return their commit times and the duration."""
    committed: list[int] = []
    gaps = random.Random(seed)
    due = 0.0
    t0 = time.monotonic()
    for seq in range(count):
        due += gaps.expovariate(rate) if arrivals == "poisson" else 1.0 / rate
        pause = t0 + due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        with transaction.atomic():
            transaction.on_commit(lambda: committed.append(time.time_ns()))
            stamp.enqueue(time.time_ns(), seq)
    return committed, time.monotonic() - t0


def measure(ctx: Context, rate: int, mode: str, repeat: int) -> None:
    sizes = ctx.sizes
    db.truncate_queue(ctx.conn)
    stamp_dir = Path(tempfile.mkdtemp(prefix="stamps-", dir=ctx.log_dir))
    watch = ctx.watch()
    worker = WorkerProcess(worker_args(sizes.latency_threads, 1), ctx.log_dir,
                           f"latency-{mode}-{rate}-r{repeat}",
                           env={STAMP_DIR_ENV: str(stamp_dir), **mode_env(mode)})
    ctx.wait_registered(worker, 1)
    time.sleep(1.0)  # let it go idle: parked, or polling with its longest pause
    count = int(rate * sizes.latency_seconds)
    committed, produced_s = _produce(rate, count, rate * 1000 + repeat, sizes.latency_arrivals)
    deadline = time.monotonic() + STRAGGLER_SECONDS
    started = _read_stamps(stamp_dir)
    while len(started) < count and time.monotonic() < deadline:
        time.sleep(0.1)
        started = _read_stamps(stamp_dir)
    worker.kill()  # its last acks don't matter: the tables are emptied next
    watch.check()
    if not started:
        raise BenchError(f"latency {rate}/s {mode}: no task ran at all:\n{worker.tail()}")
    missing = sorted(set(range(count)) - set(started))
    stuck = db.scalar(ctx.conn, "SELECT COUNT(*) FROM mysqlq_message WHERE status = 'claimed'")
    warmup = int(rate * sizes.latency_warmup_seconds)
    latencies = [(started[seq] - committed[seq]) / 1e6 if seq in started else math.inf
                 for seq in range(warmup, count)]
    warmup_max = max(((started[s] - committed[s]) / 1e6 for s in range(warmup)
                      if s in started), default=0.0)
    ran = [value for value in latencies if math.isfinite(value)] or [math.nan]
    case = f"{rate}/s {mode}"
    details = {"repeat": repeat, "messages": count, "achieved_rate": round(count / produced_s),
               "warmup_max_ms": round(warmup_max, 2), "max_ms": round(max(ran), 2),
               "not_run": len(missing), "not_run_seqs": missing[:20],
               "left_claimed": stuck}
    ctx.results.figure("latency", case, f"not run within {STRAGGLER_SECONDS:.0f}s", "msgs",
                       note="enqueued but not started by then: counted as infinitely late"
                       ).add(len(missing))
    for pct in (50, 95, 99):
        ctx.results.figure("latency", case, f"p{pct}", "ms").add(
            percentile(latencies, pct), **(details if pct == 50 else {}))
    p50 = ctx.results.figure("latency", case, "p50", "ms")
    p50.note = (
        f"1 process x {sizes.latency_threads} threads; {count:,} msgs/repeat, "
        f"{sizes.latency_arrivals} arrivals; "
        f"achieved {min(d['achieved_rate'] for d in p50.details)}/s or more; "
        f"max {max(d['max_ms'] for d in p50.details)} ms")
    ctx.log(f"latency {case}: p50 {percentile(latencies, 50):.1f} ms, "
            f"p99 {percentile(latencies, 99):.1f} ms")
