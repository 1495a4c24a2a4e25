"""The chaos harness dates a worker's crash by the end of its process, not by its next
look: a crash noticed a second late used to have its claims' recovery (faster than the
look) judged unexplained. (No database: the "worker" is a process that exits.)"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.chaos import events as ev
from bench.chaos.events import EventLog
from bench.chaos.workers import Worker, WorkerPool, _watch_exit


def test_a_crash_is_dated_by_the_process_end_not_by_the_reap(tmp_path: Path) -> None:
    pool = WorkerPool(tmp_path, EventLog(), [])
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    worker = Worker(0, popen, tmp_path / "worker-00.log", time.time())
    pool.workers.append(worker)
    threading.Thread(target=_watch_exit, args=(worker,), daemon=True).start()
    time.sleep(0.3)
    while popen.poll() is None:
        time.sleep(0.02)
    ended = time.time()
    time.sleep(1.5)  # the harness looks late
    assert pool.reap() == 1
    [crash] = pool.events.of(ev.CRASH)
    assert crash.pid == popen.pid
    assert abs(crash.at - ended) < 0.25, (crash.at, ended)
    assert worker.ended_at == crash.at
