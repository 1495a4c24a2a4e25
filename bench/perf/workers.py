"""``runqueueworker`` subprocesses started by the harness, never left behind.

Each worker runs in its own session (process group), so a supervisor's children go with
it; every wait has a deadline and checks the server meanwhile, so a restarted MariaDB or
a stuck worker fails the run instead of hanging it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .errors import BenchError

ROOT = Path(__file__).resolve().parents[2]
POLL_SECONDS = 0.05
CHECK_SECONDS = 1.0


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DJANGO_SETTINGS_MODULE"] = "bench.perf.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class WorkerProcess:
    """One ``python -m django runqueueworker ...`` with its output in files."""

    def __init__(self, args: list[str], log_dir: Path, name: str,
                 env: dict[str, str] | None = None) -> None:
        self.args = args
        self.name = name
        self.stdout_path = log_dir / f"{name}.out"
        self.stderr_path = log_dir / f"{name}.err"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "django", "runqueueworker", "--skip-checks", *args],
                cwd=ROOT, env=worker_env(env), stdout=out, stderr=err,
                start_new_session=True,
            )
        self.started = time.monotonic()
        _live.append(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def tail(self, lines: int = 15) -> str:
        text = self.stderr_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(text)

    def _failure(self, what: str) -> BenchError:
        return BenchError(
            f"Worker {self.name} ({' '.join(self.args)}) {what}. Last lines of its "
            f"stderr ({self.stderr_path}):\n{self.tail()}"
        )

    def wait(self, timeout: float, check: Callable[[], None] | None = None,
             kill_late: bool = True) -> float:
        """Wait for the exit; return the seconds it ran. Exit status must be 0.

        Past ``timeout`` the worker is killed (unless ``kill_late`` is false) and the
        wait fails.
        """
        deadline = time.monotonic() + timeout
        next_check = time.monotonic() + CHECK_SECONDS
        while self.popen.poll() is None:
            now = time.monotonic()
            if now > deadline:
                if kill_late:
                    self.kill()
                raise self._failure(f"did not finish within {timeout:.0f}s")
            if check is not None and now >= next_check:
                try:
                    check()
                except BenchError:
                    self.kill()
                    raise
                next_check = now + CHECK_SECONDS
            time.sleep(POLL_SECONDS)
        elapsed = time.monotonic() - self.started
        _forget(self)
        if self.popen.returncode != 0:
            raise self._failure(f"exited with status {self.popen.returncode}")
        return elapsed

    def wait_or_stop(self, timeout: float, check: Callable[[], None] | None = None) -> bool:
        """Wait up to ``timeout`` for the exit; past it, stop gracefully (SIGTERM).

        Returns whether the worker finished on its own. For measurements that must stay
        bounded even when the library is slow (a claim whose cost grows with the backlog).
        """
        try:
            self.wait(timeout, check, kill_late=False)
            return True
        except BenchError:
            if self.popen.poll() is not None:  # it exited badly, or the server went away
                raise
        self.stop()
        return False

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful drain), then wait; exit status must be 0."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        self.wait(timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        _forget(self)


_live: list[WorkerProcess] = []


def _forget(process: WorkerProcess) -> None:
    with contextlib.suppress(ValueError):
        _live.remove(process)


def kill_all() -> None:
    """Kill every worker this harness started that still runs (and its children)."""
    for process in list(_live):
        process.kill()


def worker_args(threads: int, processes: int, batch: int | None = None,
                burst: bool = False, max_tasks: int | None = None,
                queues: str | None = None) -> list[str]:
    """Arguments of one worker shape; a single process reports its summary as JSON."""
    args = ["--concurrency", str(threads), "-v", "0"]
    if processes > 1:
        args += ["--processes", str(processes)]
    else:
        args.append("--json-summary")
    if batch is not None:
        args += ["--batch", str(batch)]
    if burst:
        args += ["--burst", "--burst-wait", "0"]
    if max_tasks is not None:
        args += ["--max-tasks", str(max_tasks)]
    if queues is not None:
        args += ["--queues", queues]
    return args


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, its waited-for children too) of a live process on this
    host, from ``/proc/<pid>/stat``; None where that can't be read (not Linux, gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return sum(int(value) for value in fields[11:15]) / ticks
