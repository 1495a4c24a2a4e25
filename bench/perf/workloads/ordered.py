"""Ordered subjects and concurrency limits: what the gates cost a burn-down.

Three drains by one worker shape (``ordered_shape``, claim batch ``ordered_batch``), each
rated like the burn-down (succeeded attempts over first start to last finish, from the
history):

* ``unordered`` then ``ordered``: ``ordered_subjects`` x ``ordered_per_subject`` no-op
  messages, first without a subject, then each in its subject (enqueued subject by
  subject's turn: every subject's 1st message, then every 2nd ...), in the same run; the
  ``ordered/unordered`` figure is their ratio (the issue's bar: at least 50 %);
* ``one subject``: ``ordered_one_subject`` messages of a single subject, which can only
  run one after another; its figures are the rate and the mean and p95 gap between one
  message's ack (its history row's ``finished_at``) and the next one's start;
* ``limited``: ``ordered_limited_keys`` x ``ordered_limited_per_key`` messages of a task
  with ``concurrency_limit=4`` per key;
* ``rated``: ``ordered_rated_keys`` x ``ordered_rated_per_key`` messages of a task with
  ``rate_limit="100/s"`` per key; the ``rated/limit`` figure is the rate each key reached
  over its limit (at most 1: the limit holds; near 1: workers keep up with it).
"""

from __future__ import annotations

import time
from typing import Any

from .. import db
from ..benchapp.tasks import (
    LIMITED_NOOP_LIMIT,
    RATED_NOOP_PER_SECOND,
    limited_noop,
    noop,
    ordered_noop,
    rated_noop,
)
from ..context import Context
from ..errors import BenchError
from ..results import percentile
from ..workers import WorkerProcess, worker_args

#: Messages per enqueue_many() while filling.
FILL_CHUNK = 1000

#: Gaps between consecutive messages of one subject, ack to next start (database clock).
GAPS_SQL = """
SELECT TIMESTAMPDIFF(MICROSECOND, finished_at, started_at) FROM (
  SELECT started_at, LAG(finished_at) OVER (ORDER BY message_id) AS finished_at
    FROM mysqlq_attempt WHERE id > %s AND outcome = 'succeeded') AS consecutive
 WHERE finished_at IS NOT NULL
"""


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    for repeat in range(ctx.repeat):
        count = sizes.ordered_subjects * sizes.ordered_per_subject
        plain = drain(ctx, "unordered", repeat,
                      lambda count=count: fill(noop, [()] * count))
        ordered = drain(ctx, "ordered", repeat, lambda: fill(ordered_noop, [
            (f"s{s}",) for _ in range(sizes.ordered_per_subject)
            for s in range(sizes.ordered_subjects)]))
        ratio = ctx.results.figure("ordered", "ordered/unordered", "ratio", "x")
        ratio.add(ordered / plain, repeat=repeat)
        ratio.note = "the issue's bar: at least 0.5"
        gaps: list[float] = []
        drain(ctx, "one subject", repeat,
              lambda: fill(ordered_noop, [("only",)] * sizes.ordered_one_subject), gaps)
        if gaps:
            mean = ctx.results.figure("ordered", "one subject", "mean gap", "ms")
            mean.add(sum(gaps) / len(gaps), repeat=repeat, p95=percentile(gaps, 95),
                     worst=max(gaps))
            mean.note = "ack of one message to the start of the next (database clock)"
        drain(ctx, "limited", repeat, lambda: fill(limited_noop, [
            (f"k{k}",) for _ in range(sizes.ordered_limited_per_key)
            for k in range(sizes.ordered_limited_keys)]))
        rated = drain(ctx, "rated", repeat, lambda: fill(rated_noop, [
            (f"k{k}",) for _ in range(sizes.ordered_rated_per_key)
            for k in range(sizes.ordered_rated_keys)]))
        share = ctx.results.figure("ordered", "rated/limit", "ratio", "x")
        share.add(rated / (RATED_NOOP_PER_SECOND * sizes.ordered_rated_keys), repeat=repeat)
        share.note = "each key's start rate over its limit: at most 1"


def fill(task: Any, calls: list[tuple[Any, ...]]) -> None:
    for start in range(0, len(calls), FILL_CHUNK):
        task.enqueue_many([list(call) for call in calls[start:start + FILL_CHUNK]])


def drain(ctx: Context, case: str, repeat: int, prefill: Any,
          gaps: list[float] | None = None) -> float:
    sizes = ctx.sizes
    db.truncate_queue(ctx.conn)
    started = time.perf_counter()
    prefill()
    filled = time.perf_counter() - started
    size = ctx.message_count()
    ctx.wait_for_purge()
    after = ctx.max_attempt_id()
    watch = ctx.watch()
    threads, processes = sizes.ordered_shape
    worker = WorkerProcess(worker_args(threads, processes, sizes.ordered_batch, burst=True),
                           ctx.log_dir, f"ordered-{case.replace(' ', '-')}-r{repeat}")
    finished = worker.wait_or_stop(sizes.burndown_seconds, check=watch.check)
    watch.check()
    done, seconds = ctx.attempts_window(after)
    left = ctx.message_count()
    if finished and (done != size or left):
        raise BenchError(f"ordered {case}: {done} of {size} succeeded, {left} left")
    if not done or not seconds:
        raise BenchError(f"ordered {case}: nothing finished within "
                         f"{sizes.burndown_seconds:.0f}s")
    if gaps is not None:
        cur = ctx.conn.cursor()
        cur.execute(GAPS_SQL, [after])
        gaps.extend(max(0.0, row[0] / 1000) for row in cur.fetchall())
    shape = f"{threads}x{processes} b{sizes.ordered_batch}"
    fig = ctx.results.figure("ordered", f"{case} {shape} n{size}", "tasks/s", "tasks/s")
    fig.add(done / seconds, repeat=repeat, prefill_s=round(filled, 3),
            drain_s=round(seconds, 3), done=done, stopped_early=not finished,
            limit=LIMITED_NOOP_LIMIT if case == "limited" else None)
    ctx.log(f"ordered {case} {shape}: {done / seconds:,.0f} tasks/s"
            + ("" if finished else f" STOPPED after {done:,} of {size:,}"))
    return done / seconds
