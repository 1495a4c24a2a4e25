"""When each worker process could hear broadcast messages: from its start line to its end.

A worker takes its broadcast position (the topic's last offset) before it logs ``Worker …
started: queues=…``, so every message sequenced after that line's time is past its
position. It stops reading when it is told to stop (SIGTERM), is killed, or dies: by
the crashing task, whose ledger start row is its last moment, else when the harness
noticed the exit.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from .workers import Worker

#: ``2025-01-31 12:00:00,123 <pid> <thread> INFO django_mysqlq: Worker … started: …``
_STARTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \d+ \S+ INFO \S+: "
                      r"Worker \S+ started: queues=")


@dataclasses.dataclass(frozen=True)
class Lifetime:
    pid: int
    spawned: float
    #: Its start line (None: it never got that far).
    ready: float | None
    ended: float | None


def started_at(log_path: Path) -> float | None:
    """The host time of the worker's start line, from its log (local time, ms)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        match = _STARTED.match(line)
        if match:
            moment = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S"))
            return moment + int(match[2]) / 1000
    return None


def lifetimes(workers: list[Worker], crash_runs: dict[int, float]) -> list[Lifetime]:
    """``crash_runs``: pid -> start of the crashing task's run that took it down."""
    found = []
    for worker in workers:
        ended = worker.ended_at
        if worker.pid in crash_runs:
            ended = min(ended or crash_runs[worker.pid], crash_runs[worker.pid])
        found.append(Lifetime(worker.pid, worker.started_at, started_at(worker.log_path),
                              ended))
    return found
