"""Topics: publish rate, consumer groups' drain rate, pickup latency, lag under load.

- ``publish``: ``Topic.publish`` one message per transaction, and ``publish_many`` in
  chunks of 1,000 (msgs/s, commit included).
- ``drain 1 group``: ``streams_drain`` messages published, then one worker process
  (``--groups g0``) sequences, pumps and handles them; the rate is the group's succeeded
  deliveries over first start to last finish (database clock).
- ``drain 4 groups``: the same messages handled by four groups of the topic, one worker
  process each (the same shape as the single group); each group's rate (its deliveries
  over the first start of any group to its own last finish) and the slowest group's
  ratio to the single group's (the issue asks ≥ 50 %).
- for each drain, the CPU it used: the members' and the server's CPU seconds per
  delivery, the cores busy, and (four groups) the ceiling the CPU alone puts on the ratio.
- ``latency``: one message per transaction at ``streams_latency_rate`` with one worker
  parked for wake-ups; start of the handler minus the commit (this host's clock).
- ``lag``: a steady publisher at ``streams_lag_rate`` for ``streams_lag_seconds`` while
  one group consumes; the lag (messages) sampled every 0.25 s: its maximum and its growth
  per second (a least-squares slope: ~0 when the group keeps up).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from django.db import transaction

from django_mysqlq import broker

from .. import db
from ..benchapp import streams
from ..context import Context
from ..errors import BenchError
from ..results import percentile
from ..workers import WorkerProcess, cpu_seconds, worker_args
from .latency import _read_stamps

ENV = {"MYSQLQ_BENCH_STREAMS": "1"}
TOPIC_TABLES = ("mysqlq_topic", "mysqlq_topic_message", "mysqlq_topic_group",
                "mysqlq_topic_delivery")
CHUNK = 1000


def run(ctx: Context) -> None:
    for repeat in range(ctx.repeat):
        publish_rates(ctx, repeat)
        single = drain(ctx, ("g0",), repeat)
        drain(ctx, streams.GROUPS, repeat, single)
        latency(ctx, repeat)
        lag(ctx, repeat)
    _empty(ctx)


def _empty(ctx: Context) -> None:
    db.truncate_queue(ctx.conn)
    cur = ctx.conn.cursor()
    for table in TOPIC_TABLES:
        cur.execute(f"TRUNCATE TABLE {table}")


def _member(group: str, threads: int, batch: int | None, name: str, log_dir: Path,
            env: dict[str, str] | None = None) -> WorkerProcess:
    """One worker process, a member of ``group`` only."""
    return WorkerProcess([*worker_args(threads, 1, batch), "--groups", group], log_dir, name,
                         env={**ENV, **(env or {})})


def _bulk(topic: Any, count: int, first: int = 0) -> None:
    for start in range(first, first + count, CHUNK):
        with transaction.atomic():
            topic.publish_many([{"seq": seq} for seq in
                                range(start, min(start + CHUNK, first + count))])


def publish_rates(ctx: Context, repeat: int) -> None:
    _empty(ctx)
    count = ctx.sizes.streams_publish_single
    started = time.perf_counter()
    for seq in range(count):
        streams.bench.publish({"seq": seq})
    single = count / (time.perf_counter() - started)
    ctx.results.figure("streams", "publish single", "msgs/s", "msgs/s",
                       note="one publish() per transaction (autocommit)").add(
        single, repeat=repeat, messages=count)
    count = ctx.sizes.streams_publish_bulk
    started = time.perf_counter()
    _bulk(streams.bench, count)
    bulk = count / (time.perf_counter() - started)
    ctx.results.figure("streams", "publish bulk", "msgs/s", "msgs/s",
                       note=f"publish_many() of {CHUNK:,} per transaction").add(
        bulk, repeat=repeat, messages=count)
    ctx.log(f"streams publish: single {single:,.0f}/s, bulk {bulk:,.0f}/s")


def _group_rate(ctx: Context, group: str, groups: tuple[str, ...] = ()
                ) -> tuple[int, float]:
    """The group's succeeded deliveries and the seconds from the first start of any of
    ``groups`` (the drain's groups; the group alone by default) to its last finish: a
    group served after another one is not rated as if it had the workers alone."""
    cur = ctx.conn.cursor()
    names = [f"topic:bench:{g}" for g in (groups or (group,))]
    cur.execute("SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, (SELECT MIN(started_at) FROM "
                f"mysqlq_attempt WHERE task_name IN ({', '.join(['%s'] * len(names))})), "
                "MAX(finished_at)) FROM mysqlq_attempt WHERE task_name = %s "
                "AND outcome = 'succeeded'", [*names, f"topic:bench:{group}"])
    count, micros = cur.fetchone()
    return int(count), (micros or 0) / 1e6


def _drained(ctx: Context, groups: tuple[str, ...], size: int) -> bool:
    """Whether every group has pumped all ``size`` messages and no delivery of it is left
    but dead ones. Cheap on purpose: counting the history rows instead (the rate's own
    query) every 0.2 s took about 15 % of the server's CPU in a four-group drain, CPU
    the groups' members then didn't get."""
    cur = ctx.conn.cursor()
    marks = ", ".join(["%s"] * len(groups))
    cur.execute(f"SELECT COUNT(*) FROM mysqlq_topic_group WHERE topic = 'bench' AND "
                f"group_name IN ({marks}) AND position >= %s", [*groups, size])
    if cur.fetchone()[0] < len(groups):
        return False
    cur.execute(f"SELECT EXISTS(SELECT 1 FROM mysqlq_message WHERE queue IN ({marks}) "
                "AND status <> 'dead')", [f"group:{group}" for group in groups])
    return not cur.fetchone()[0]


def drain(ctx: Context, groups: tuple[str, ...], repeat: int,
          single: float | None = None) -> float:
    size = ctx.sizes.streams_drain
    _empty(ctx)
    _bulk(streams.bench, size)
    threads, batch = ctx.sizes.streams_threads, ctx.sizes.streams_batch
    spawned = time.monotonic()
    workers = [_member(group, threads, batch, f"streams-{len(groups)}g-{group}-r{repeat}",
                       ctx.log_dir) for group in groups]
    watch = ctx.watch()
    server_before = db.server_cpu_seconds(ctx.conn)
    deadline = time.monotonic() + ctx.sizes.streams_seconds
    while True:
        if _drained(ctx, groups, size) or time.monotonic() > deadline:
            break
        for worker in workers:
            if worker.popen.poll() is not None:
                raise BenchError(f"streams: worker {worker.name} exited:\n{worker.tail()}")
        watch.check()
        time.sleep(0.2)
    worker_cpu = [cpu_seconds(worker.pid) for worker in workers]
    server_after = db.server_cpu_seconds(ctx.conn)
    wall = time.monotonic() - spawned
    for worker in workers:
        worker.kill()
    rates = []
    case = f"drain {len(groups)} group{'s' if len(groups) > 1 else ''} n{size // 1000}k"
    for group in groups:
        count, seconds = _group_rate(ctx, group, groups)
        if not count or not seconds:
            raise BenchError(f"streams {case}: group {group} handled nothing")
        rates.append(count / seconds)
        ctx.results.figure("streams", f"{case} {group}", "msgs/s", "msgs/s",
                           note=f"1 process x {threads} threads per group, batch {batch}"
                           ).add(count / seconds, repeat=repeat, done=count,
                                 stopped_early=count < size)
    handled = sum(_group_rate(ctx, group)[0] for group in groups)
    members_cpu = None if None in worker_cpu else sum(c for c in worker_cpu if c is not None)
    if handled and members_cpu is not None:
        ctx.results.figure("streams", case, "worker CPU per delivery", "us",
                           note="the member processes' CPU seconds / deliveries").add(
            members_cpu / handled * 1e6, repeat=repeat)
    if handled and server_before is not None and server_after is not None:
        ctx.results.figure("streams", case, "server CPU per delivery", "us",
                           note="mariadbd's CPU seconds / deliveries (every client's, "
                           "if the server is shared)").add(
            (server_after - server_before) / handled * 1e6, repeat=repeat)
    if single:
        ctx.results.figure("streams", case, "slowest group / single group", "ratio",
                           note="the issue asks >= 0.5").add(min(rates) / single)
    if handled and members_cpu is not None and server_before is not None \
            and server_after is not None:
        _cpu_budget(ctx, case, len(groups), handled, wall, single,
                    members_cpu + server_after - server_before, repeat)
    ctx.log(f"streams {case}: " + ", ".join(f"{r:,.0f}/s" for r in rates))
    return rates[0]


def _cpu_budget(ctx: Context, case: str, groups: int, handled: int, seconds: float,
                single: float | None, cpu_seconds: float, repeat: int) -> None:
    """How much of the machine the drain used, and what the CPU alone allows: with
    ``c`` CPU seconds (members and server) per delivery on ``n`` cores, no group of ``g``
    can beat ``n / (g * c)`` deliveries a second, whatever the design around it. Its
    ratio to the single group's rate is the four-group target's ceiling on this machine
    at this cost per delivery (the server counted whole: exact when it serves only the
    bench; the members' start-up is in both the CPU and the seconds, from their spawn to
    the drain's end)."""
    cores = os.cpu_count() or 1
    if seconds:
        ctx.results.figure("streams", case, "CPU cores busy", "cores",
                           note=f"members' + server's CPU seconds / seconds from spawn, of "
                           f"{cores}").add(cpu_seconds / seconds, repeat=repeat)
    if single and cpu_seconds:
        ceiling = cores / (groups * cpu_seconds / handled)
        ctx.results.figure("streams", case, "CPU-bound ceiling / single group", "ratio",
                           note=f"{cores} cores / ({groups} groups x CPU per delivery), "
                           "over the single group's rate").add(ceiling / single,
                                                               repeat=repeat)


def latency(ctx: Context, repeat: int) -> None:
    _empty(ctx)
    rate = ctx.sizes.streams_latency_rate
    stamp_dir = Path(tempfile.mkdtemp(prefix="stream-stamps-", dir=ctx.log_dir))
    worker = _member("lat", 4, None, f"streams-latency-r{repeat}", ctx.log_dir,
                     {"MYSQLQ_BENCH_STAMP_DIR": str(stamp_dir)})
    ctx.wait_registered(worker, 1)
    # Its group made (a member creates it after registering; with start "latest", what
    # is published before that is not the group's to handle), then parked.
    deadline = time.monotonic() + 60.0
    while broker.position("benchlat", "lat") is None:
        if time.monotonic() > deadline:
            raise BenchError("streams latency: the member never created its group")
        time.sleep(0.05)
    time.sleep(1.0)
    count = int(rate * ctx.sizes.streams_latency_seconds)
    committed: list[int] = []
    t0 = time.monotonic()
    for seq in range(count):
        pause = t0 + seq / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        with transaction.atomic():
            transaction.on_commit(lambda: committed.append(time.time_ns()))
            streams.benchlat.publish({"seq": seq})
    deadline = time.monotonic() + 5.0
    started = _read_stamps(stamp_dir)
    while len(started) < count and time.monotonic() < deadline:
        time.sleep(0.1)
        started = _read_stamps(stamp_dir)
    worker.kill()
    warmup = max(1, count // 10)
    latencies = [(started[seq] - committed[seq]) / 1e6 if seq in started else float("inf")
                 for seq in range(warmup, count)]
    case = f"latency {rate}/s"
    for pct in (50, 95, 99):
        ctx.results.figure("streams", case, f"p{pct}", "ms",
                           note="publish commit to handler start, wake-ups on").add(
            percentile(latencies, pct), repeat=repeat, messages=count,
            not_run=count - len(started))
    ctx.log(f"streams {case}: p50 {percentile(latencies, 50):.1f} ms, "
            f"p99 {percentile(latencies, 99):.1f} ms")


def lag(ctx: Context, repeat: int) -> None:
    _empty(ctx)
    rate, seconds = ctx.sizes.streams_lag_rate, ctx.sizes.streams_lag_seconds
    worker = _member("g0", ctx.sizes.streams_threads, ctx.sizes.streams_batch,
                     f"streams-lag-r{repeat}", ctx.log_dir)
    ctx.wait_registered(worker, 1)
    samples: list[tuple[float, int]] = []
    t0 = time.monotonic()
    per_tick = max(1, rate // 20)
    seq = 0
    next_sample = t0
    while time.monotonic() - t0 < seconds:
        streams.bench.publish_many([{"seq": s} for s in range(seq, seq + per_tick)])
        seq += per_tick
        now = time.monotonic()
        if now >= next_sample:
            found = broker.groups("bench", "g0")
            samples.append((now - t0, found[0].lag if found else seq))
            next_sample = now + 0.25
        pause = t0 + seq / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    worker.kill()
    achieved = seq / (time.monotonic() - t0)
    if len(samples) < 2:
        raise BenchError("streams lag: too few samples")
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_l = sum(v for _, v in samples) / len(samples)
    slope = sum((t - mean_t) * (v - mean_l) for t, v in samples) / max(
        sum((t - mean_t) ** 2 for t, _ in samples), 1e-9)
    case = f"lag at {rate}/s"
    ctx.results.figure("streams", case, "lag growth", "msgs/s",
                       note="least-squares slope of the lag; ~0: the group keeps up").add(
        slope, repeat=repeat, achieved_rate=round(achieved), max_lag=max(v for _, v in samples))
    ctx.log(f"streams {case}: growth {slope:,.1f} msgs/s, max lag "
            f"{max(v for _, v in samples)} (published {achieved:,.0f}/s)")
