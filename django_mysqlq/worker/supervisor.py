"""``runqueueworker --processes P``: P forked worker processes kept alive by a supervisor.

The supervisor holds no database connection and runs no task. It restarts a child that
died (crash, ``kill -9``, OOM), replaces one that exited after ``--max-tasks`` or
``--max-memory`` or a task timeout, and forwards SIGTERM/SIGINT so every child drains
gracefully; a second signal is forwarded too, and the children then exit at once.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import time
from types import FrameType

from django.db import connections

from .draining import EXIT_TIMEOUT
from .loop import Worker
from .options import WorkerOptions

logger = logging.getLogger("django_mysqlq")

#: A child that dies sooner than this after its start counts as crash-looping.
QUICK_DEATH_SECONDS = 5.0
RESTART_BACKOFF_MAX = 30.0
TICK_SECONDS = 0.2
PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class Child:
    slot: int
    pid: int
    started: float


def _die_with_parent(parent: int) -> None:
    """Ask Linux for SIGTERM when the supervisor dies, so no child runs unsupervised."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: children notice at their next claim
        return
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _run_child(options: WorkerOptions, parent: int) -> int:
    """Body of a forked child: a fresh worker with its own signal handlers."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    _die_with_parent(parent)
    worker = Worker(dataclasses.replace(options, kill_on_timeout=True))
    return worker.run()


def _describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    code = os.WEXITSTATUS(status)
    if code == EXIT_TIMEOUT:
        return "ended after a task ran past its timeout"
    return f"exited with status {code}"


class Supervisor:
    """Keeps ``processes`` worker children running until told to stop."""

    def __init__(self, options: WorkerOptions, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}.")
        self.options = options
        self.processes = processes
        self.children: dict[int, Child] = {}
        self.restarts = 0
        self._signals_received = 0
        self._backoff: dict[int, float] = {}
        self._not_before: dict[int, float] = {}
        #: Children that did not exit 0 while the supervisor was stopping.
        self._unclean_stops = 0

    # ------------------------------------------------------------------ children

    def _spawn(self, slot: int) -> None:
        connections.close_all()  # never share a connection across fork
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child
            status = 1
            try:
                status = _run_child(self.options, parent)
            except BaseException:  # a child must never return into the parent's code
                logger.exception("Worker process crashed")
            finally:
                logging.shutdown()
                os._exit(status)
        self.children[pid] = Child(slot=slot, pid=pid, started=time.monotonic())
        logger.info("Supervisor started worker process %d (slot %d).", pid, slot)

    def _reap(self) -> list[tuple[Child, int]]:
        ended = []
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            child = self.children.pop(pid, None)
            if child is not None:
                ended.append((child, status))
        return ended

    def _replace(self, child: Child, status: int) -> None:
        """Decide whether and when a slot gets a new child."""
        clean = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if clean and self.options.burst:
            logger.info("Worker process %d drained its queues.", child.pid)
            return
        if clean:
            reason = "was recycled (--max-tasks or --max-memory)"
        else:
            reason = _describe_exit(status)
        quick = time.monotonic() - child.started < QUICK_DEATH_SECONDS and not clean
        delay = min(self._backoff.get(child.slot, 0.5) * 2, RESTART_BACKOFF_MAX) if quick else 0
        self._backoff[child.slot] = delay or 0.5
        self._not_before[child.slot] = time.monotonic() + delay
        log = logger.info if clean else logger.warning
        log("Worker process %d %s; replacing it%s.", child.pid, reason,
            f" in {delay:.1f}s (it died quickly)" if delay else "")
        self.restarts += 1

    def _fill_slots(self) -> None:
        taken = {child.slot for child in self.children.values()}
        now = time.monotonic()
        for slot, not_before in list(self._not_before.items()):
            if slot not in taken and now >= not_before:
                del self._not_before[slot]
                self._spawn(slot)

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_received += 1
        name = signal.Signals(signum).name
        if self._signals_received == 1:
            logger.info("%s received: draining %d worker process(es).", name,
                        len(self.children))
        else:
            logger.warning("Second %s: worker processes exit at once.", name)
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        logger.info("Supervisor %d starting %d worker process(es).", os.getpid(),
                    self.processes)
        for slot in range(self.processes):
            self._spawn(slot)
        while self.children or (self._not_before and not self._signals_received):
            time.sleep(TICK_SECONDS)
            for child, status in self._reap():
                if self._signals_received:
                    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                        self._unclean_stops += 1
                    logger.info("Worker process %d stopped (%s).", child.pid,
                                _describe_exit(status))
                else:
                    self._replace(child, status)
            if not self._signals_received:
                self._fill_slots()
        logger.info("Supervisor stopped after %d restart(s).", self.restarts)
        return 0 if self._signals_received <= 1 and not self._unclean_stops else 1
