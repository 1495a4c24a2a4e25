"""How big each workload is: the full run, the ``--smoke`` run, and ``--set`` overrides."""

from __future__ import annotations

import dataclasses

#: Every workload, in the order a run measures them (raw first: the others compare to it).
WORKLOADS = ("raw", "enqueue", "burndown", "latency", "idle", "backlog", "contention",
             "ordered", "streams")
#: Measured only when named in ``--only``: ``cluster`` needs the Galera cluster of
#: bench/cluster/galera.sh (three more mariadbd on this machine).
OPTIONAL_WORKLOADS = ("cluster",)
ALL_WORKLOADS = WORKLOADS + OPTIONAL_WORKLOADS

Shape = tuple[int, int]  # (threads per process, processes)
#: How idle workers learn of new messages: parked in SQL and woken, or polling.
MODES = ("wakeup", "poll")
#: How the latency producer spaces its messages: evenly (the issue's fixed rate) or Poisson.
ARRIVALS = ("fixed", "poisson")


@dataclasses.dataclass(frozen=True)
class Sizes:
    # raw floor (plain MySQLdb)
    raw_single_inserts: int = 5_000
    raw_multi_statements: int = 50  # of 1,000 rows each
    raw_cycles_one: int = 3_000  # claim+read+delete of 1 row
    raw_cycle_rows: int = 30_000  # rows moved by the 10/100/500-row cycles
    #: Longest one cycle case runs (a claim whose cost grows with the backlog is slow).
    raw_cycle_seconds: float = 15.0
    # enqueue through the library
    enqueue_single: int = 5_000
    enqueue_many: int = 100_000
    # burn-down: (size, shapes, batches) groups
    burndown: tuple[tuple[int, tuple[Shape, ...], tuple[int, ...]], ...] = (
        (20_000, ((1, 1), (4, 1), (8, 1), (4, 2), (8, 2)), (10, 100)),
        (100_000, ((8, 2),), (100,)),
    )
    #: The best documented configuration: (size, shapes, claim batch, ACK_BATCH_SIZE).
    burndown_tuned: tuple[tuple[int, tuple[Shape, ...], int, int], ...] = (
        (20_000, ((4, 2), (8, 2)), 100, 100),
        (100_000, ((4, 2),), 100, 100),
    )
    burndown_seconds: float = 90.0  # a burn still running is stopped (SIGTERM) and rated
    # pickup latency
    latency_rates: tuple[int, ...] = (50, 500)
    latency_modes: tuple[str, ...] = MODES
    latency_seconds: float = 10.0
    latency_warmup_seconds: float = 1.0
    latency_threads: int = 4
    latency_arrivals: str = "fixed"
    # idle load
    idle_cases: tuple[tuple[int, str], ...] = ((1, "wakeup"), (4, "wakeup"), (4, "poll"))
    idle_threads: int = 4
    idle_seconds: float = 10.0
    idle_settle_seconds: float = 3.0
    idle_baseline_seconds: float = 3.0  # other sessions' Questions/s, no worker running
    # backlog scaling
    backlog_small: int = 10_000
    backlog_large: int = 1_000_000
    backlog_history: int = 1_000_000
    backlog_drain: int = 8_000
    backlog_shape: Shape = (4, 1)
    backlog_batch: int = 100
    backlog_probe: int = 200  # raw 1-row claim cycles timed on each table state
    #: Bounds that keep a run finite when the claim's cost grows with the backlog.
    backlog_probe_seconds: float = 5.0
    backlog_drain_seconds: float = 30.0
    # claim contention
    contention_claimers: tuple[int, ...] = (1, 2, 4, 8)
    contention_backlog: int = 20_000
    contention_batch: int = 10
    contention_seconds: float = 20.0  # claimers stop claiming after this long
    #: Longest wait for InnoDB purge to catch up before a burn-down (0: don't wait).
    purge_wait_seconds: float = 10.0
    # cluster: the same burn-down on the single server and on the Galera cluster
    cluster_size: int = 20_000
    #: Threads of each of the two worker processes (one per worker node on the cluster).
    cluster_threads: int = 4
    cluster_batch: int = 100
    # ordered subjects and concurrency limits (bench/perf/workloads/ordered.py)
    ordered_subjects: int = 10_000
    ordered_per_subject: int = 10
    ordered_one_subject: int = 10_000
    ordered_limited_keys: int = 100
    ordered_limited_per_key: int = 100
    #: Rate-limited drain: keys x messages per key of ``rated_noop`` (100/s per key).
    ordered_rated_keys: int = 4
    ordered_rated_per_key: int = 1_000
    ordered_shape: Shape = (8, 2)
    ordered_batch: int = 100
    # topics (bench/perf/workloads/streams.py)
    streams_publish_single: int = 5_000
    streams_publish_bulk: int = 100_000
    streams_drain: int = 100_000
    streams_threads: int = 8
    streams_batch: int = 100
    streams_seconds: float = 120.0  # a drain still running is stopped and rated
    streams_latency_rate: int = 50
    streams_latency_seconds: float = 10.0
    streams_lag_rate: int = 500
    streams_lag_seconds: float = 20.0


FULL = Sizes()

SMOKE = Sizes(
    raw_single_inserts=100, raw_multi_statements=2, raw_cycles_one=100, raw_cycle_rows=1_000,
    enqueue_single=200, enqueue_many=2_000,
    burndown=((1_000, ((4, 1), (4, 2)), (10, 100)),),
    burndown_tuned=((1_000, ((4, 2),), 100, 100),),
    latency_rates=(50,), latency_modes=("wakeup",), latency_seconds=1.5,
    latency_warmup_seconds=0.2,
    idle_cases=((1, "wakeup"),), idle_seconds=1.5, idle_settle_seconds=0.5,
    idle_baseline_seconds=0.5,
    backlog_small=500, backlog_large=5_000, backlog_history=5_000, backlog_drain=300,
    backlog_probe=50, backlog_drain_seconds=20.0,
    contention_claimers=(1, 2), contention_backlog=1_000,
    purge_wait_seconds=0.0, cluster_size=1_000,
    ordered_subjects=200, ordered_per_subject=5, ordered_one_subject=300,
    ordered_limited_keys=20, ordered_limited_per_key=20, ordered_shape=(4, 2),
    ordered_rated_keys=2, ordered_rated_per_key=100,
    streams_publish_single=100, streams_publish_bulk=2_000, streams_drain=1_000,
    streams_threads=4, streams_seconds=30.0, streams_latency_seconds=1.5,
    streams_lag_rate=100, streams_lag_seconds=1.5,
)


def override(sizes: Sizes, assignments: list[str]) -> Sizes:
    """``sizes`` with ``name=value`` assignments applied (``--set``), type-checked.

    Numbers and strings take one value; tuples take Python literals, e.g.
    ``latency_rates=(50,500)``. Unknown names and values of the wrong type are refused.
    """
    import ast

    fields = {f.name: f for f in dataclasses.fields(Sizes)}
    changes: dict[str, object] = {}
    for text in assignments:
        name, sep, raw = text.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise ValueError(f"--set {text!r}: expected NAME=VALUE with NAME one of "
                             f"{', '.join(fields)}")
        current = getattr(sizes, name)
        try:
            value = raw.strip() if isinstance(current, str) else ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"--set {text!r}: {raw!r} is not a Python literal") from None
        if isinstance(current, float) and isinstance(value, int):
            value = float(value)
        if isinstance(current, tuple) and isinstance(value, list):
            value = tuple(value)
        if type(value) is not type(current):
            raise ValueError(f"--set {text!r}: {name} takes a {type(current).__name__}, "
                             f"like {current!r}")
        changes[name] = value
    result = dataclasses.replace(sizes, **changes)  # type: ignore[arg-type]
    if result.latency_arrivals not in ARRIVALS:
        raise ValueError(f"latency_arrivals must be one of {', '.join(ARRIVALS)}")
    if not set(result.latency_modes) <= set(MODES):
        raise ValueError(f"latency_modes must be among {', '.join(MODES)}")
    return result
