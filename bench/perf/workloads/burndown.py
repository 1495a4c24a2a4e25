"""Burn-down: a pre-filled queue of no-op tasks drained by ``runqueueworker --burst``.

The rate is taken from the history the workers write: succeeded attempts divided by the
time from the first start to the last finish (database clock), so process start-up is
left out; the wall time including start-up is kept in the details. A burn still running
after ``burndown_seconds`` is stopped with SIGTERM (a drain) and rated on what finished,
so a slow claim shows as a low rate, not as a run that never ends.
"""

from __future__ import annotations

import json
import resource
import time
from typing import Any

from .. import db
from ..benchapp.tasks import noop
from ..context import Context
from ..errors import BenchError
from ..workers import WorkerProcess, worker_args


def case_name(threads: int, processes: int, batch: int, size: int,
              ack_batch: int | None = None) -> str:
    ack = f" a{ack_batch}" if ack_batch is not None else ""
    return f"{threads}x{processes} b{batch} n{size // 1000}k{ack}"


def run(ctx: Context) -> None:
    groups = ctx.sizes.burndown
    for repeat in range(ctx.repeat):  # repeats interleaved: drift spreads over all shapes
        for size, shapes, batches in groups:
            for threads, processes in shapes:
                for batch in batches:
                    burn(ctx, size, threads, processes, batch, repeat)
        # The tuned configuration: bigger ack batches (MYSQLQ['ACK_BATCH_SIZE']).
        for size, shapes, batch, ack_batch in ctx.sizes.burndown_tuned:
            for threads, processes in shapes:
                burn(ctx, size, threads, processes, batch, repeat, ack_batch)


def burn(ctx: Context, size: int, threads: int, processes: int, batch: int,
         repeat: int, ack_batch: int | None = None) -> None:
    db.truncate_queue(ctx.conn)
    started = time.perf_counter()
    noop.enqueue_many([noop.call() for _ in range(size)])
    prefill = time.perf_counter() - started
    hll_before, purge_wait = ctx.wait_for_purge()
    watch = ctx.watch()
    deadlocks_before = db.global_status(ctx.conn, "Innodb_deadlocks", "Innodb_row_lock_waits")
    case = case_name(threads, processes, batch, size, ack_batch)
    env = {"MYSQLQ_BENCH_ACK_BATCH": str(ack_batch)} if ack_batch is not None else None
    cpu_before = _children_cpu()
    worker = WorkerProcess(worker_args(threads, processes, batch, burst=True), ctx.log_dir,
                           f"burndown-{case.replace(' ', '-')}-r{repeat}", env=env)
    finished = worker.wait_or_stop(ctx.sizes.burndown_seconds, check=watch.check)
    wall = time.monotonic() - worker.started
    # The workers' CPU (every process of the shape, start-up included): reaped children.
    worker_cpu = _children_cpu() - cpu_before
    watch.check()
    hll_after = db.history_list_length(ctx.conn)
    deadlocks_after = db.global_status(ctx.conn, "Innodb_deadlocks", "Innodb_row_lock_waits")
    done, seconds = ctx.attempts_window()
    left = ctx.message_count()
    if finished and (done != size or left):
        raise BenchError(f"burn-down {case}: {done} of {size} succeeded, {left} left")
    if not done:
        raise BenchError(f"burn-down {case}: nothing finished within "
                         f"{ctx.sizes.burndown_seconds:.0f}s")
    details: dict[str, Any] = {
        "repeat": repeat, "prefill_s": round(prefill, 3), "wall_s": round(wall, 3),
        "drain_s": round(seconds, 3), "hll_before": hll_before, "hll_after": hll_after,
        "purge_wait_s": round(purge_wait, 1), "done": done, "stopped_early": not finished,
        "worker_cpu_s": round(worker_cpu, 3),
        # Start-up included (about 0.3 s a process): python -m bench.perf.cpu leaves it out.
        "cpu_us_per_task": round(worker_cpu / done * 1e6, 1) if done else None,
        "innodb_deadlocks": deadlocks_after["Innodb_deadlocks"]
        - deadlocks_before["Innodb_deadlocks"],
        "innodb_row_lock_waits": deadlocks_after["Innodb_row_lock_waits"]
        - deadlocks_before["Innodb_row_lock_waits"],
    }
    if processes == 1:
        details["worker_summary"] = _summary(worker.stdout())
    fig = ctx.results.figure("burndown", case, "tasks/s", "tasks/s",
                             raw_ref=f"raw/claim_ack_{batch}/rows/s")
    fig.add(done / seconds, **details)
    fig.note = _note(fig.details)
    cut = sum(1 for d in fig.details if d["stopped_early"])
    if cut:
        fig.note += (f"; STOPPED after {ctx.sizes.burndown_seconds:g}s in {cut} repeat(s): "
                     "rate from the tasks that finished")
    ctx.log(f"burndown {case}: {done / seconds:,.0f} tasks/s (HLL {hll_before}->{hll_after})"
            + ("" if finished else f" STOPPED after {done:,} of {size:,}"))


def _children_cpu() -> float:
    """CPU seconds of this process's children that ended and were waited for (their own
    waited-for children included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _summary(stdout: str) -> Any:
    """The worker's ``--json-summary`` (its counters: deadlocks, lock waits...), or its text."""
    lines = stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return stdout.strip()


def _note(details: list[dict[str, object]]) -> str:
    def median(key: str) -> float:
        values = sorted(float(d[key]) for d in details)  # type: ignore[arg-type]
        return values[len(values) // 2]

    return (f"HLL {median('hll_before'):,.0f}->{median('hll_after'):,.0f}; prefill "
            f"{median('prefill_s'):.1f}s; wall incl. start-up {median('wall_s'):.1f}s")
