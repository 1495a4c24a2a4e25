"""``runqueueworker --processes P``: P forked worker processes kept alive by a supervisor.

The supervisor runs no task and holds no database connection while its children run
(it reads the queue's state once, before forking them). It restarts a child that
died (crash, ``kill -9``, OOM: after a growing pause when they die soon after their
start), replaces one that exited after ``--max-tasks`` or ``--max-memory`` or a task
timeout (at once), and passes a stop on (SIGTERM, SIGINT, SIGHUP) so every child drains
gracefully; after a second signal the children exit at once. It tells
its children on signals of their own (``stopping.DRAIN_SIGNAL``, ``EXIT_SIGNAL``): a stop
sent to the whole process group reaches each child too, and is one stop, not two.

With ``--burst``, a child that drained its queues is not replaced, and the supervisor's
exit status says whether any child saw messages go dead (``EXIT_DEAD``): as its exit
status says, or as its counts do (``childreport``: a child ended by a task past its
timeout exits ``EXIT_TIMEOUT``, whatever became of the message). A child the
database can't serve (``fatal``: tables missing, login refused) is not replaced either:
the supervisor stops the others and exits with that child's status.
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

from ..exceptions import WorkerCannotRun
from . import childreport, queues
from .databases import Workers
from .draining import EXIT_DEAD, EXIT_TIMEOUT
from .fatal import EXIT_CANNOT_RUN
from .options import WorkerOptions
from .stats import Figures, add_up
from .stopping import CHILD_SIGNALS, DRAIN_SIGNAL, EXIT_SIGNAL, STOP_SIGNALS, install_handlers

logger = logging.getLogger("django_mysqlq")

#: A child that dies sooner than this after its start counts as crash-looping (one that
#: exits ``EXIT_TIMEOUT``, ended by a task's timeout, never does).
QUICK_DEATH_SECONDS = 5.0
RESTART_BACKOFF_MAX = 30.0
TICK_SECONDS = 0.2
PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class Child:
    slot: int
    pid: int
    started: float
    #: The read end of its pipe: the counts it sends at its end (``childreport``).
    report_fd: int


def _die_with_parent(parent: int) -> None:
    """Ask Linux for a drain when the supervisor dies, so no child runs unsupervised."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, DRAIN_SIGNAL)
    except (OSError, AttributeError):  # not Linux: children notice at their next claim
        return
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), DRAIN_SIGNAL)


def _run_child(options: WorkerOptions, parent: int, report_fd: int) -> int:
    """Body of a forked child: a fresh worker with its own signal handlers.

    The child signals stay blocked (as the supervisor forked it) until the worker's
    handlers are in place (``stopping.install_handlers``). Its counts go to the
    supervisor on ``report_fd`` at its end, whichever way it ends (``childreport``)."""
    for signum in STOP_SIGNALS:
        if callable(signal.getsignal(signum)):  # the supervisor's: not the child's
            signal.signal(signum, signal.SIG_DFL)
    _die_with_parent(parent)
    # The supervisor reported on the queues once for all its children.
    workers = Workers(dataclasses.replace(options, kill_on_timeout=True, report_queues=False,
                                          supervised=True))
    childreport.connect(report_fd, lambda: workers.figures)
    try:
        return workers.run()
    except WorkerCannotRun as exc:
        logger.critical("Worker process %d can't run: %s", os.getpid(), exc)
        return exc.exit_status


def _describe_exit(status: int) -> str:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:  # a real-time signal (kill -40) has no name
            return f"killed by signal {signum}"
    code = os.WEXITSTATUS(status)
    if code == EXIT_TIMEOUT:
        return "ended after a task ran past its timeout"
    if code == EXIT_CANNOT_RUN:
        return "can't run until the database is fixed (see its error above)"
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
        #: A ``--burst`` child saw messages go dead.
        self._dead_seen = False
        #: How many, as the children's counts say.
        self._dead = 0
        #: The ended children's figures (``childreport``), by database alias.
        self._reports: dict[str, list[Figures]] = {}
        self._started = time.monotonic()
        #: A child the database can't serve: everything stops, nothing is replaced.
        self._cannot_run = False

    # ------------------------------------------------------------------ children

    def _spawn(self, slot: int) -> None:
        """Fork a child, unless stopping: it would never hear of a stop already passed on.

        Signals are blocked meanwhile: the child inherits the mask and lets them through
        once its handlers are in place; a stop whose handler ran here after the fork but
        before the child was listed is passed on to it at once."""
        connections.close_all()  # never share a connection across fork
        parent = os.getpid()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, CHILD_SIGNALS)
        try:
            if self._stopping:
                return
            read_fd, write_fd = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(read_fd)
                os.close(write_fd)
                raise
            if pid == 0:  # the child
                status = 1
                try:
                    os.close(read_fd)
                    for other in self.children.values():  # the other children's pipes
                        os.close(other.report_fd)
                    status = _run_child(self.options, parent, write_fd)
                except BaseException:  # a child must never return into the parent's code
                    logger.exception("Worker process crashed")
                finally:
                    childreport.send()
                    logging.shutdown()
                    os._exit(status)
            os.close(write_fd)
            self.children[pid] = Child(slot=slot, pid=pid, started=time.monotonic(),
                                       report_fd=read_fd)
            if self._stopping:
                os.kill(pid, EXIT_SIGNAL if self._signals_received > 1 else DRAIN_SIGNAL)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
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
                self._take_report(child)
                ended.append((child, status))
        return ended

    def _take_report(self, child: Child) -> None:
        """Read what an ended child did, for the summary: a death in it makes a
        ``--burst`` run's status (a child ended by a task's timeout exits
        ``EXIT_TIMEOUT`` even when that left the message dead)."""
        report = childreport.receive(child.report_fd)
        for alias, figures in report or []:
            self._reports.setdefault(alias, []).append(figures)
        dead = sum(int(figures.get("dead", 0)) for _, figures in report or [])
        if dead and self.options.burst:
            self._dead += dead
            self._dead_seen = True

    @property
    def figures(self) -> list[tuple[str, Figures]]:
        """The summary's figures: the children's counts summed per database alias (those
        that reported: a child killed outright takes its counts with it), over the
        supervisor's run."""
        seconds = time.monotonic() - self._started
        if not self._reports:
            return [("", add_up([], seconds))]
        return [(alias, add_up(found, seconds)) for alias, found in self._reports.items()]

    def _replace(self, child: Child, status: int) -> None:
        """Decide whether and when a slot gets a new child."""
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        clean = code == 0
        if code == EXIT_CANNOT_RUN:
            logger.error("Worker process %d can't run until the database is fixed; stopping "
                         "the others.", child.pid)
            self._cannot_run = True
            self._not_before.clear()
            self._forward(DRAIN_SIGNAL)
            return
        if self.options.burst and (clean or code == EXIT_DEAD):
            self._dead_seen = self._dead_seen or code == EXIT_DEAD
            logger.info("Worker process %d drained its queues%s.", child.pid,
                        "; messages went dead meanwhile" if code == EXIT_DEAD else "")
            return
        if clean:
            reason = "was recycled (--max-tasks or --max-memory)"
        else:
            reason = _describe_exit(status)
        # A child that ended itself after a task's timeout started and ran it: no crash,
        # however soon it came. It is replaced at once, and resets the slot's pause.
        deliberate = clean or code == EXIT_TIMEOUT
        quick = time.monotonic() - child.started < QUICK_DEATH_SECONDS and not deliberate
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
            self._forward(DRAIN_SIGNAL)
        else:
            logger.warning("Second %s: worker processes exit at once.", name)
            self._forward(EXIT_SIGNAL)

    def _forward(self, signum: int) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        self._started = time.monotonic()
        install_handlers(self._on_signal)
        logger.info("Supervisor %d starting %d worker process(es).", os.getpid(),
                    self.processes)
        if self.options.report_queues:
            # Once for all children, counting their queues as served; raises
            # WorkerCannotRun before any child starts if the database can't serve them.
            queues.report(f"Supervisor {os.getpid()}", self.options.queues)
        for slot in range(self.processes):
            self._spawn(slot)
        while self.children or (self._not_before and not self._stopping):
            time.sleep(TICK_SECONDS)
            for child, status in self._reap():
                if self._stopping:
                    self._stopped(child, status)
                else:
                    self._replace(child, status)
            if not self._stopping:
                self._fill_slots()
        logger.info("Supervisor stopped after %d restart(s).", self.restarts)
        return self._status()

    @property
    def _stopping(self) -> bool:
        return bool(self._signals_received) or self._cannot_run

    def _stopped(self, child: Child, status: int) -> None:
        """A child ended while everything stops."""
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        if code == EXIT_CANNOT_RUN:
            self._cannot_run = True
        elif code == EXIT_DEAD and self.options.burst:
            self._dead_seen = True
        elif code != 0 and not self._cannot_run:
            self._unclean_stops += 1
        logger.info("Worker process %d stopped (%s).", child.pid, _describe_exit(status))

    def _status(self) -> int:
        if self._cannot_run:
            return EXIT_CANNOT_RUN
        if self._signals_received > 1 or self._unclean_stops:
            return 1
        if not self._dead_seen or self.options.exit_zero:
            return 0
        logger.warning("Supervisor %d: %s went dead during this --burst run; exiting with "
                       "status %d (--exit-zero exits 0).", os.getpid(),
                       f"{self._dead} message(s)" if self._dead else "messages", EXIT_DEAD)
        return EXIT_DEAD
