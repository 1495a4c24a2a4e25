"""What every workload gets: sizes, repeats, the harness connection, results, helpers."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.test.utils import override_settings

from . import db
from .config import Sizes
from .errors import BenchError
from .results import Results
from .workers import WorkerProcess

NOOP_TASK = "bench.perf.benchapp.tasks.noop"
NOOP_PAYLOAD = '{"args":[],"kwargs":{}}'
DEFAULT_QUEUE = "default"

#: A multi-row INSERT … SELECT of ready no-op messages from MariaDB's sequence engine.
_FILL_SQL = """
INSERT INTO mysqlq_message
       (queue, task_name, payload, status, priority, enqueued_at, run_at, attempts,
        max_attempts, retry_backoff, timeout, last_error)
SELECT %s, %s, %s, 'ready', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 0, 1, 0, NULL, ''
  FROM seq_1_to_{n}
"""

#: Finished history rows shaped like the ones ack_many writes.
_HISTORY_SQL = """
INSERT INTO mysqlq_attempt
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload)
SELECT seq, %s, %s, 1, 'succeeded', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
       'bench:prefill', 'bench', 1, 1, 'mysqlq-task-0', '', '', '', NULL, %s
  FROM seq_1_to_{n}
"""
FILL_CHUNK = 100_000


def mode_env(mode: str) -> dict[str, str]:
    """Environment of a worker subprocess for a mode of ``config.MODES``."""
    return {"MYSQLQ_BENCH_WAKEUP": "1" if mode == "wakeup" else "0"}


@contextlib.contextmanager
def harness_mode(mode: str) -> Iterator[None]:
    """The harness as a producer in that mode: ``poll`` sends no wake-ups."""
    with override_settings(MYSQLQ={**settings.MYSQLQ, "WAKEUP": mode == "wakeup"}):
        yield


@dataclasses.dataclass
class Context:
    sizes: Sizes
    repeat: int
    smoke: bool
    log_dir: Path
    conn: Any  # the harness's own MySQLdb connection
    results: Results = dataclasses.field(default_factory=Results)

    def log(self, message: str) -> None:
        print(f"[bench] {message}", flush=True)

    def watch(self) -> db.ServerWatch:
        return db.ServerWatch(self.conn)

    def wait_registered(self, worker: WorkerProcess, processes: int,
                        timeout: float = 30.0) -> None:
        """Wait until ``processes`` worker rows are live (the workers are up)."""
        deadline = time.monotonic() + timeout
        while db.scalar(self.conn, "SELECT COUNT(*) FROM mysqlq_worker "
                        "WHERE stopped_at IS NULL") < processes:
            if worker.popen.poll() is not None or time.monotonic() > deadline:
                worker.kill()
                raise BenchError(f"Worker {worker.name} did not start within {timeout:.0f}s:"
                                 f"\n{worker.tail()}")
            time.sleep(0.05)

    def fill_ready(self, count: int, queue: str = DEFAULT_QUEUE) -> float:
        """Insert ``count`` ready no-op messages server-side; return the seconds it took."""
        return self._fill(_FILL_SQL, count, [queue, NOOP_TASK, NOOP_PAYLOAD])

    def fill_history(self, count: int) -> float:
        """Insert ``count`` succeeded attempt rows; return the seconds it took."""
        return self._fill(_HISTORY_SQL, count, [DEFAULT_QUEUE, NOOP_TASK, NOOP_PAYLOAD])

    def _fill(self, sql: str, count: int, params: list[Any]) -> float:
        started = time.perf_counter()
        cur = self.conn.cursor()
        left = count
        while left > 0:
            chunk = min(FILL_CHUNK, left)
            cur.execute(sql.format(n=chunk), params)
            left -= chunk
        return time.perf_counter() - started

    def wait_for_purge(self, below: int = 5_000) -> tuple[int, float]:
        """Give InnoDB purge up to ``purge_wait_seconds`` to shrink the history list.

        Returns the history list length reached and the seconds waited. The server is
        shared, so the length may never get below ``below``: the wait is bounded.
        """
        started = time.monotonic()
        length = db.history_list_length(self.conn)
        while length > below and time.monotonic() - started < self.sizes.purge_wait_seconds:
            time.sleep(0.5)
            length = db.history_list_length(self.conn)
        return length, time.monotonic() - started

    def attempts_window(self, after_id: int = 0) -> tuple[int, float]:
        """``(succeeded attempts, seconds from first start to last finish)`` after an id."""
        cur = self.conn.cursor()
        cur.execute(
            "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(started_at), MAX(finished_at)) "
            "FROM mysqlq_attempt WHERE id > %s AND outcome = 'succeeded'", [after_id])
        count, micros = cur.fetchone()
        return int(count), (micros or 0) / 1e6

    def max_attempt_id(self) -> int:
        return int(db.scalar(self.conn, "SELECT COALESCE(MAX(id), 0) FROM mysqlq_attempt"))

    def message_count(self) -> int:
        return int(db.scalar(self.conn, "SELECT COUNT(*) FROM mysqlq_message"))
