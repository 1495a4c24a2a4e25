"""kill -9 of a worker stopped inside one step (tests/stall_at.py stops it there): the
start, the wait for its stop, the kill, for tests/test_kill_steps.py and
tests/test_topic_kill_steps.py."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import wait_for

PATIENCE = 90.0
WORKER = ("--concurrency", "4", "--batch", "8")


def stalling_worker(start_worker: Callable[..., Any], pattern: str, marker: Path,
                    env: dict[str, str] | None = None) -> Any:
    """A worker that stops for good after its first statement matching ``pattern``."""
    return start_worker(*WORKER, env={**(env or {}), "MYSQLQ_TEST_STALL_AT": pattern,
                                      "MYSQLQ_TEST_STALL_FILE": str(marker)})


def kill_when_stalled(worker: Any, marker: Path, step: str) -> None:
    """Wait until ``worker`` has stopped inside ``step``, then kill -9 it there."""
    wait_for(marker.exists, timeout=PATIENCE, message=f"the worker to stop inside {step}")
    assert worker.popen.poll() is None, worker.output()
    worker.signal(signal.SIGKILL)
    assert worker.wait(timeout=10) == -signal.SIGKILL
    assert marker.read_text().splitlines()[0].startswith(str(worker.pid)), marker.read_text()
