"""``runqueueworker`` subprocesses: start, kill, stop, replace, and notice crashes.

Every worker is started from the harness's main thread with ``PR_SET_PDEATHSIG``, so a
harness that dies (even by SIGKILL) takes its workers with it; each runs in its own
session, so a Ctrl-C in the terminal reaches the harness only.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import events as ev
from .events import EventLog

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "bench.chaos.settings"
PR_SET_PDEATHSIG = 1
#: Longest a SIGTERMed worker may take (GRACE_SECONDS is 10) before it is killed.
STOP_PATIENCE = 25.0

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def worker_env(port: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DJANGO_SETTINGS_MODULE"] = SETTINGS
    env["PYTHONUNBUFFERED"] = "1"
    if port is not None:  # a node of a Galera cluster (--galera)
        env["MYSQLQ_CHAOS_PORT"] = str(port)
    return env


@dataclasses.dataclass
class Worker:
    index: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    started_at: float
    #: running, stopping (SIGTERM sent), killed, exited
    state: str = "running"
    signalled_at: float = 0.0
    #: The database port it connects to (a cluster node), or None: the harness's.
    port: int | None = None
    #: When it was told to stop (SIGTERM), killed, or found dead (host epoch seconds).
    ended_at: float | None = None
    #: When its process ended, as seen by a thread blocked in ``wait()`` on it: a crash is
    #: dated by this, not by the next :meth:`WorkerPool.reap` (which may come a second
    #: later, while the queue has already recovered the claims the crash left).
    exited_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


def _watch_exit(worker: Worker) -> None:
    """Note the moment the worker's process ends (runs in a thread of its own)."""
    with contextlib.suppress(Exception):
        worker.popen.wait()
        worker.exited_at = time.time()


def _started(worker: Worker) -> bool:
    """Whether the worker had logged its start (its signal handlers were installed
    before that line, and it claims only after it)."""
    try:
        return "started: queues=" in worker.log_path.read_text(errors="replace")
    except OSError:
        return True  # no log to tell: count it as started (an unclean stop if non-zero)


class WorkerPool:
    def __init__(self, log_dir: Path, events: EventLog, args: list[str],
                 ports: tuple[int, ...] = ()) -> None:
        self.log_dir = log_dir
        self.events = events
        self.args = args
        self.workers: list[Worker] = []
        self.exit_statuses: dict[int, int] = {}
        #: Cluster nodes to spread the workers over (--galera), and the ones down now.
        self.ports = ports
        self.down: set[int] = set()

    def _next_port(self) -> int | None:
        """The node with the fewest running workers, among those up (None: no cluster)."""
        up = [port for port in self.ports if port not in self.down] or list(self.ports)
        if not up:
            return None
        running = [worker.port for worker in self.running()]
        return min(up, key=lambda port: (running.count(port), up.index(port)))

    def start(self) -> Worker:
        index = len(self.workers)
        log_path = self.log_dir / f"worker-{index:02d}.log"
        port = self._next_port()
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "django", "runqueueworker", *self.args],
                cwd=ROOT, env=worker_env(port), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        worker = Worker(index, popen, log_path, time.time(), port=port)
        self.workers.append(worker)
        threading.Thread(target=_watch_exit, args=(worker,), daemon=True,
                         name=f"exit-of-{popen.pid}").start()
        return worker

    def ports_by_pid(self) -> dict[int, int | None]:
        return {worker.pid: worker.port for worker in self.workers}

    def running(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.state == "running"]

    def youngest_age(self) -> float:
        running = self.running()
        return min((time.time() - w.started_at for w in running), default=float("inf"))

    def kill(self, worker: Worker, detail: str = "") -> None:
        """SIGKILL, recorded the moment before it is sent."""
        event = self.events.add(ev.KILL, worker.pid, detail=detail)
        worker.state = "killed"
        worker.ended_at = event.at
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
        self._wait(worker, 10)

    def terminate(self, worker: Worker) -> None:
        """SIGTERM: a graceful stop, reaped later by :meth:`reap`."""
        self.events.add(ev.SIGTERM, worker.pid)
        worker.state = "stopping"
        worker.signalled_at = worker.ended_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)

    def _wait(self, worker: Worker, timeout: float) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            status = worker.popen.wait(timeout)
            self.exit_statuses[worker.pid] = status
            return status
        return None

    def reap(self) -> int:
        """Notice exits: crashes of running workers, ends of stopping ones.

        Returns how many running workers crashed (the caller replaces them).
        """
        crashed = 0
        for worker in self.workers:
            status = worker.popen.poll()
            if worker.state == "running" and status is not None:
                worker.state = "exited"
                worker.ended_at = worker.exited_at or time.time()
                self.exit_statuses[worker.pid] = status
                self.events.add(ev.CRASH, worker.pid, at=worker.ended_at,
                                detail=f"exit status {status}")
                crashed += 1
            elif worker.state == "stopping" and status is not None:
                worker.state = "exited"
                self.exit_statuses[worker.pid] = status
                if status == -signal.SIGTERM and not _started(worker):
                    self.events.add(ev.STOPPED_STARTING, worker.pid, port=worker.port,
                                    detail="SIGTERMed before it had started")
                elif status != 0:
                    self.events.add(ev.STOP_STATUS, worker.pid, port=worker.port,
                                    detail=f"exit status {status} after SIGTERM")
            elif worker.state == "stopping" and time.time() - worker.signalled_at > STOP_PATIENCE:
                self.events.add(ev.STOP_OVERRUN, worker.pid, port=worker.port,
                                detail=f"still running {STOP_PATIENCE:.0f}s after SIGTERM")
                worker.state = "killed"
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
                self._wait(worker, 10)
        return crashed

    def stop_all(self) -> None:
        """SIGTERM every worker still alive and wait for all of them (bounded)."""
        for worker in self.running():
            worker.state = "stopping"
            worker.signalled_at = worker.ended_at = time.time()
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)
        while any(worker.state == "stopping" for worker in self.workers):
            self.reap()
            time.sleep(0.1)

    def kill_all(self) -> None:
        """Last resort (harness error or Ctrl-C): nothing may outlive the run."""
        for worker in self.workers:
            if worker.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGKILL)
                self._wait(worker, 10)
