"""How big each workload is: the full run and the ``--quick`` smoke run."""

from __future__ import annotations

import dataclasses

#: Every workload, in the order a run measures them (raw first: the others compare to it).
WORKLOADS = ("raw", "enqueue", "burndown", "latency", "idle", "backlog", "contention")

Shape = tuple[int, int]  # (threads per process, processes)
#: How idle workers learn of new messages: parked in SQL and woken, or polling.
MODES = ("wakeup", "poll")


@dataclasses.dataclass(frozen=True)
class Sizes:
    # raw floor (plain MySQLdb)
    raw_single_inserts: int = 5_000
    raw_multi_statements: int = 50  # of 1,000 rows each
    raw_cycles_one: int = 3_000  # claim+read+delete of 1 row
    raw_cycle_rows: int = 30_000  # rows moved by the 10/100/500-row cycles
    # enqueue through the library
    enqueue_single: int = 5_000
    enqueue_many: int = 100_000
    # burn-down: (size, shapes, batches) groups
    burndown: tuple[tuple[int, tuple[Shape, ...], tuple[int, ...]], ...] = (
        (20_000, ((1, 1), (4, 1), (8, 1), (4, 2), (8, 2)), (10, 100)),
        (100_000, ((8, 2),), (100,)),
    )
    # pickup latency
    latency_rates: tuple[int, ...] = (50, 500)
    latency_modes: tuple[str, ...] = MODES
    latency_seconds: float = 10.0
    latency_warmup_seconds: float = 1.0
    latency_threads: int = 4
    # idle load
    idle_cases: tuple[tuple[int, str], ...] = ((1, "wakeup"), (4, "wakeup"), (4, "poll"))
    idle_threads: int = 4
    idle_seconds: float = 10.0
    idle_settle_seconds: float = 3.0
    # backlog scaling
    backlog_small: int = 10_000
    backlog_large: int = 1_000_000
    backlog_history: int = 1_000_000
    backlog_drain: int = 8_000
    backlog_shape: Shape = (4, 1)
    backlog_batch: int = 100
    backlog_probe: int = 200  # raw 1-row claim cycles timed on each table state
    # claim contention
    contention_claimers: tuple[int, ...] = (1, 2, 4, 8)
    contention_backlog: int = 20_000
    contention_batch: int = 10
    #: Longest wait for InnoDB purge to catch up before a burn-down (0: don't wait).
    purge_wait_seconds: float = 10.0


FULL = Sizes()

QUICK = Sizes(
    raw_single_inserts=200, raw_multi_statements=3, raw_cycles_one=200, raw_cycle_rows=2_000,
    enqueue_single=200, enqueue_many=2_000,
    burndown=((1_000, ((4, 1), (4, 2)), (10, 100)),),
    latency_rates=(50,), latency_modes=("wakeup",), latency_seconds=1.5,
    latency_warmup_seconds=0.2,
    idle_cases=((1, "wakeup"),), idle_seconds=1.5, idle_settle_seconds=0.5,
    backlog_small=500, backlog_large=5_000, backlog_history=5_000, backlog_drain=300,
    backlog_probe=50,
    contention_claimers=(1, 2), contention_backlog=1_000,
    purge_wait_seconds=0.0,
)
