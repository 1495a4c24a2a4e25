"""The shape of a chaos run: how long, how many workers and producers, how hard."""

from __future__ import annotations

import dataclasses
from typing import Any

#: Messages of one concurrency key of ``chaos.limited`` that may run at once.
GATE_LIMIT = 2
#: The rate limit of each key of ``chaos.rated``: starts of one key per window.
RATE_LIMIT = 3
RATE_WINDOW_SECONDS = 2
#: Starts a window may hold beyond the limit in the audit. The limit is taken when a
#: worker claims the message; the start follows on a free task thread, so one start of the
#: window before may slip into it.
RATE_SLACK = 1


@dataclasses.dataclass(frozen=True)
class ChaosConfig:
    #: Seconds of load and chaos (the drain and the analysis come after).
    seconds: float
    workers: int = 3
    concurrency: int = 4
    batch: int = 5
    producers: int = 2
    #: Messages per second, all producers together.
    rate: float = 30.0
    #: Messages per producer transaction: 1 to this many.
    max_batch: int = 3
    atomic_share: float = 0.3
    #: Messages in an ordered subject, and under a concurrency key (of ``gate_keys`` each).
    ordered_share: float = 0.2
    limited_share: float = 0.15
    gate_keys: int = 8
    #: Messages of the rate-limited task (``RATE_LIMIT`` per ``RATE_WINDOW_SECONDS`` per
    #: key, of ``rate_keys``): about the limit's pace, so a fault's backlog drains at it.
    rated_share: float = 0.1
    rate_keys: int = 2
    delayed_share: float = 0.15
    #: Longest delay of a delayed message, in seconds.
    max_delay: float = 1.0
    #: Each task sleeps 0 to this many milliseconds (drawn per message by the producer).
    max_sleep_ms: int = 300
    #: Items of a producer transaction that publish to the topic (instead of enqueueing a
    #: task); of those, the share that publishes 2 to ``max_bulk`` at once (publish_many).
    topic_share: float = 0.3
    bulk_share: float = 0.4
    max_bulk: int = 4
    #: Topic messages with a key (one of ``topic_keys``), handled in order per group.
    keyed_share: float = 0.8
    topic_keys: int = 8
    #: Each topic handler sleeps 0 to this many milliseconds.
    topic_max_sleep_ms: int = 20
    #: Producer transactions rolled back on purpose.
    rollback_share: float = 0.05
    #: Mean seconds between two chaos actions (kill -9, SIGTERM, KILL CONNECTION, a
    #: crashing task, a locked row).
    mean_interval: float = 4.0
    #: How long the "locked row" action holds its ready row ``FOR UPDATE``.
    locked_row_seconds: float = 4.0
    #: No chaos in the first and last seconds of the run.
    warmup: float = 3.0
    cooldown: float = 3.0
    restart: bool = True
    #: Longest wait for the queue to empty once the producers stopped.
    drain_timeout: float = 45.0
    seed: int = 0
    #: Fail the run when the median kill-to-reclaim time exceeds this.
    recovery_limit: float = 5.0
    #: --galera: the harness and producers on node 1's port, workers on these ports (taken
    #: in turn), and one node of them killed -9 instead of the server restart, started
    #: again after ``node_down_seconds``.
    galera: bool = False
    worker_ports: tuple[int, ...] = ()
    node_down_seconds: float = 4.0

    def worker_args(self) -> list[str]:
        return ["--concurrency", str(self.concurrency), "--batch", str(self.batch)]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
