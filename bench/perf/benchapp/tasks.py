"""The benchmark's tasks. ``stamp`` appends one line per run to a file of its process.

One ``os.write`` on an ``O_APPEND`` descriptor per task: no database write that would
compete with the queue's own statements, no buffer to lose when the worker exits, and
lines from several threads never interleave.
"""

from __future__ import annotations

import os
import threading
import time

from django_mysqlq import queue_task

#: Directory the stamp files go to; the harness sets it for the workers it starts.
STAMP_DIR_ENV = "MYSQLQ_BENCH_STAMP_DIR"

_fd: int | None = None
_fd_pid = 0
_lock = threading.Lock()


def _stamp_fd() -> int:
    global _fd, _fd_pid
    pid = os.getpid()
    with _lock:
        if _fd is None or _fd_pid != pid:  # a forked child opens its own file
            directory = os.environ.get(STAMP_DIR_ENV, ".")
            _fd = os.open(os.path.join(directory, f"stamp-{pid}.log"),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            _fd_pid = pid
        return _fd


@queue_task(max_attempts=1)
def noop() -> None:
    """Does nothing: a burn-down of these measures the queue alone."""


@queue_task(max_attempts=1)
def stamp(enqueued_ns: int, seq: int = -1) -> None:
    """Record when this run started: ``seq enqueued_ns started_ns`` (wall clock, ns)."""
    started_ns = time.time_ns()
    os.write(_stamp_fd(), f"{seq} {enqueued_ns} {started_ns}\n".encode())


#: Messages of one key of ``limited_noop`` that may run at once.
LIMITED_NOOP_LIMIT = 4


@queue_task(max_attempts=1, ordered_by="subject")
def ordered_noop(subject: str) -> None:
    """Does nothing, one at a time per subject, in order (bench/perf/workloads/ordered.py)."""


#: The rate limit of ``rated_noop``, per key: starts per second.
RATED_NOOP_PER_SECOND = 100


@queue_task(max_attempts=1, rate_limit=f"{RATED_NOOP_PER_SECOND}/s", rate_limit_key="key")
def rated_noop(key: str) -> None:
    """Does nothing, at most ``RATED_NOOP_PER_SECOND`` starts a second per key."""


@queue_task(max_attempts=1, concurrency_key="key", concurrency_limit=LIMITED_NOOP_LIMIT)
def limited_noop(key: str) -> None:
    """Does nothing, at most ``LIMITED_NOOP_LIMIT`` at once per key."""
