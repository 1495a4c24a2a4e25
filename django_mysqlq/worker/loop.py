"""The worker process: one control thread that claims, N threads that run tasks.

The control thread (the main thread) owns the claiming connection: it claims batches,
renews leases and the worker's heartbeat, promotes due scheduled messages and, when the
recovery lock is free, sweeps the claims of vanished peers. Task threads run messages
and settle them on their own connections. The loop holds no SQL: it calls the broker.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import queue
import socket
import threading
import time
import uuid

from django.db import DatabaseError, connections

from .. import broker
from ..conf import QueueSettings, get_settings
from ..exceptions import TaskTimeout
from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import Outcome
from ..signals import task_overran, worker_started, worker_stopped
from ..tasks import import_task_modules
from .acker import Acker
from .executor import execute
from .options import WorkerOptions
from .stats import WorkerStats
from .stopping import STOP_STATEMENT_SECONDS, StopRequest

logger = logging.getLogger("django_mysqlq")

#: Exit status of a worker process ended because a task ran past its timeout.
EXIT_TIMEOUT = 75


@dataclasses.dataclass
class RunningTask:
    message: ClaimedMessage
    started: float  # monotonic
    started_at: dt.datetime  # database clock, for history
    reported: bool = False


def _qualified_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def resident_memory_mb() -> float:
    """This process's resident set size in MiB (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20

#: Shortest and longest pause after a failed loop step (database down).
ERROR_BACKOFF = (0.2, 5.0)
#: First pause after an empty claim; doubles up to ``MYSQLQ['POLL_SECONDS']``.
IDLE_BACKOFF_START = 0.02
#: First park of an idle worker in SQL; doubles up to ``MYSQLQ['HEARTBEAT_SECONDS']``.
PARK_START = 0.025
#: Seconds between two reads of the paused queues: how soon a pause or resume takes effect.
PAUSE_CHECK_SECONDS = 1.0


@dataclasses.dataclass
class Due:
    """Monotonic times at which the control loop's periodic duties are next due."""

    beat: float
    recovery: float
    stale_check: float
    promote: float
    summary: float
    paused_check: float

    @classmethod
    def starting_now(cls, settings: QueueSettings) -> Due:
        now = time.monotonic()
        summary = now + settings.SUMMARY_SECONDS if settings.SUMMARY_SECONDS else float("inf")
        # Sweep at once: a restarted worker frees its previous life's claims.
        return cls(beat=now + settings.HEARTBEAT_SECONDS, recovery=now, stale_check=now,
                   promote=now, summary=summary, paused_check=now)


class Worker:
    """Runs tasks from the given queues until stopped (or drained, in burst mode)."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.settings = get_settings()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self.stats = WorkerStats()
        self._wakeup = threading.Event()
        self.stop_request = StopRequest(self._wakeup)
        self._give_up = threading.Event()
        self._inbox: queue.Queue[ClaimedMessage | None] = queue.Queue()
        self._in_flight = 0
        self._running: dict[int, RunningTask] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._claimed_total = 0
        self._due = Due.starting_now(self.settings)
        self._poll = IDLE_BACKOFF_START
        self._park = PARK_START
        self._listening = False
        #: The last park found nothing ready and nobody woke it: the next park's own
        #: check covers the claim, so an idle worker costs one query per park.
        self._nothing_ready = False
        self._reconnected = False
        #: The worker's queues minus those an operator paused, re-read every second while
        #: busy; a parked worker learns of a change from its park statement.
        self._active: list[str] = list(options.queues)
        self._paused_seen: str | None = None
        batch = self.settings.ACK_BATCH_SIZE
        self._acker = Acker(batch, self.settings.ACK_DELAY_SECONDS, self._give_up,
                            self.stats.add) if batch > 1 else None
        #: Counts database outages seen by the control loop; task threads recheck on change.
        self._outages = 0

    # ------------------------------------------------------------------ task threads

    def _task_thread(self) -> None:
        thread = threading.current_thread().name
        runner = Runner(worker_id=self.id, host=self.host, pid=self.pid, thread=thread)
        last_used = time.monotonic()
        outages_seen = self._outages
        try:
            while True:
                message = self._inbox.get()
                if message is None:
                    return
                if outages_seen != self._outages or time.monotonic() - last_used > 1.0:
                    # An idle connection may have died with the server: check it first,
                    # so the task's first query doesn't fail on it and spend an attempt.
                    outages_seen = self._outages
                    try:
                        broker.ensure_usable()
                    except DatabaseError:
                        broker.close_if_broken()
                with self._lock:
                    self._running[message.id] = RunningTask(message, time.monotonic(),
                                                            broker.database_now())
                handover = self._acker.handover() if self._acker is not None else None
                try:
                    outcome = execute(message, runner, self._give_up, handover)
                except Exception:
                    # execute() records every task failure itself; this is a bug or an
                    # outage it could not ride out. The claim stays; a peer recovers it.
                    logger.exception("Unexpected error while running %s #%s",
                                     message.task_name, message.id)
                    outcome = ""
                self._count(outcome, handed=handover is not None and handover.used)
                with self._lock:
                    self._running.pop(message.id, None)
                    self._in_flight -= 1
                self._wakeup.set()
                last_used = time.monotonic()
        finally:
            connections.close_all()

    def _count(self, outcome: str, handed: bool = False) -> None:
        if outcome == Outcome.SUCCEEDED and not handed:  # the acker counts those once acked
            self.stats.add(succeeded=1)
        elif outcome == Outcome.RETRIED:
            self.stats.add(retried=1)
        elif outcome == Outcome.FAILED:
            self.stats.add(dead=1)

    # ------------------------------------------------------------------ control loop

    def run(self) -> int:
        """Work until stopped; return the process exit status."""
        self.stop_request.install()
        import_task_modules()
        self._start()
        try:
            self._loop()
        finally:
            status = self._drain()
        return status

    def _start(self) -> None:
        self._call_until_up(lambda: broker.register_worker(
            self.id, self.host, self.pid, self.options.queues, self.options.concurrency))
        if self._acker is not None:
            self._acker.start()
        for index in range(self.options.concurrency):
            thread = threading.Thread(target=self._task_thread, name=f"mysqlq-task-{index}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("Worker %s started: queues=%s concurrency=%d batch=%d liveness=%s%s",
                    self.id, ",".join(self.options.queues), self.options.concurrency,
                    self.options.claim_batch, self.settings.LIVENESS,
                    " (burst)" if self.options.burst else "")
        broker.send_robust(worker_started, self)

    def _call_until_up(self, operation: object) -> None:
        delay = ERROR_BACKOFF[0]
        while not self.stop_request.is_set():
            try:
                operation()  # type: ignore[operator]
                return
            except DatabaseError as exc:
                self._database_trouble(exc, delay)
                delay = min(delay * 2, ERROR_BACKOFF[1])

    def _database_trouble(self, exc: DatabaseError, delay: float) -> None:
        self.stats.add(db_errors=1)
        self._outages += 1
        logger.warning("Database error in the worker loop (%s); retrying in %.1fs.", exc, delay)
        broker.close_if_broken()
        self._wakeup.wait(delay)
        self._wakeup.clear()

    def _loop(self) -> None:
        error_delay = ERROR_BACKOFF[0]
        while not self.stop_request.is_set():
            # Cleared before looking, so a task finishing meanwhile wakes the next wait.
            self._wakeup.clear()
            try:
                self._upkeep()
                claimed = 0 if self._nothing_ready else self._claim()
                self._nothing_ready = False
                if self._finished(claimed):
                    return
                if claimed:
                    self._poll = IDLE_BACKOFF_START
                else:
                    self._idle()
                error_delay = ERROR_BACKOFF[0]
            except DatabaseError as exc:
                if broker.was_interrupted(exc):
                    continue  # a late wake-up cut a statement short: just go round again
                self._listening = False
                self._reconnected = True
                self._database_trouble(exc, error_delay)
                error_delay = min(error_delay * 2, ERROR_BACKOFF[1])

    def _upkeep(self) -> None:
        """Whatever is due: heartbeat, recovery sweep, promotion, overruns, summary."""
        conf, due, now = self.settings, self._due, time.monotonic()
        if self._reconnected:
            # Our row may still say 'listening' on a connection id that died with the
            # outage: producers must not KILL whatever now has that id.
            broker.listen(self.id, False)
            self._reconnected = False
        if now >= due.beat:
            self._heartbeat()
            due.beat = now + conf.HEARTBEAT_SECONDS
        if now >= due.recovery and not self._listening:
            # (A parked worker's next park checks whether a sweep is needed at all.)
            self._sweep(now)
        if broker.is_recovery_leader() and now >= due.stale_check:
            broker.mark_stale_workers()
            due.stale_check = now + conf.LEASE_SECONDS
        if now >= due.paused_check and not self._nothing_ready:
            # (After a park that slept through nothing is claimed, so this can wait.)
            self._refresh_paused()
            due.paused_check = now + PAUSE_CHECK_SECONDS
        if now >= due.promote:
            broker.promote_due()
            due.promote = now + conf.POLL_SECONDS
        self._report_overruns()
        if now >= due.summary:
            logger.info("Worker %s: %s", self.id, self.stats.summary())
            due.summary = now + conf.SUMMARY_SECONDS

    def _sweep(self, now: float) -> None:
        """Recover vanished workers' claims (the leader), or see if the leader is gone."""
        self.stats.add(recovered=len(broker.recover(keep_lock=True)))
        self._schedule_sweep(now)

    def _schedule_sweep(self, now: float) -> None:
        # The leader sweeps; the others only check now and then that it is still there.
        leader = broker.is_recovery_leader()
        self._due.recovery = now + self.settings.RECOVERY_SECONDS * (1 if leader else 2)

    def _refresh_paused(self) -> None:
        paused = broker.paused_queues()
        active = [queue for queue in self.options.queues if queue not in paused]
        if active != self._active:
            logger.info("Worker %s: claiming from %s%s.", self.id, ",".join(active) or "nothing",
                        f" (paused: {','.join(sorted(paused & set(self.options.queues)))})"
                        if paused & set(self.options.queues) else "")
            self._active = active

    def _idle(self) -> None:
        """Nothing claimed: wait for a task slot, a wake-up, due work or the next upkeep."""
        conf, due = self.settings, self._due
        with self._lock:
            busy = self._in_flight > 0
        now = time.monotonic()
        parking = not busy and conf.WAKEUP and bool(self._active)
        sweep_check = ""
        if parking and now >= due.recovery:
            # This park does the sweep's first step; it lasts until the next one is due.
            sweep_check = "leader" if broker.is_recovery_leader() else "follower"
            self._schedule_sweep(now)
        # A parked worker's heartbeat waits for the end of the park (at most a recovery
        # interval late, well inside a lease) rather than cutting it short.
        until_upkeep = max(0.0, (due.recovery if parking else min(due.beat, due.recovery))
                           - now)
        if not parking:
            until_upkeep = min(until_upkeep, max(0.0, due.paused_check - now))
            # Tasks finishing set the event; otherwise poll with a growing pause.
            self._wakeup.wait(min(self._poll, until_upkeep))
            self._poll = min(self._poll * 2, conf.POLL_SECONDS)
            return
        if not self._listening:
            broker.listen(self.id, True)
            self._listening = True
            self._park = PARK_START
        result, paused = broker.idle_wait(self._active, min(self._park, until_upkeep),
                                          sweep_check, watched=self.options.queues)
        if paused is not None and paused != self._paused_seen:
            self._paused_seen = paused
            self._refresh_paused()
        # Short first parks: a producer may trust a 'nobody listens' answer briefly.
        self._park = min(self._park * 2, conf.HEARTBEAT_SECONDS)
        if result == "sweep" or (result == "interrupted" and sweep_check):
            self._sweep(time.monotonic())
        if result in ("ready", "woken", "interrupted", "due"):
            if result == "due":
                due.promote = 0.0
            broker.listen(self.id, False)
            self._listening = False
        elif result == "sweep":
            # Not a wake-up: stay parked; the next park looks for ready work first.
            self._nothing_ready = True
        else:
            # Slept through: nothing was ready or due when the park began, and a producer
            # or the due time would have cut it short. Parks watch the schedule, so the
            # periodic promotion can wait too.
            self._nothing_ready = True
            due.promote = max(due.promote, time.monotonic() + conf.POLL_SECONDS)

    def _claim(self) -> int:
        """Claim as many messages as there is room for; hand them to the task threads."""
        options = self.options
        with self._lock:
            in_flight = self._in_flight
        if in_flight >= options.concurrency or self._over_memory():
            return 0
        room = max(options.concurrency, options.claim_batch) - in_flight
        wanted = min(options.claim_batch, room)
        if options.max_tasks is not None:
            wanted = min(wanted, options.max_tasks - self._claimed_total)
        if wanted <= 0 or not self._active:
            return 0
        messages = broker.claim(self._active, wanted, self.id, self.settings.LEASE_SECONDS)
        if messages:
            with self._lock:
                self._in_flight += len(messages)
            self._claimed_total += len(messages)
            for message in messages:
                self._inbox.put(message)
        return len(messages)

    def _finished(self, claimed: int) -> bool:
        """Whether a burst or max-tasks worker has nothing left to do."""
        with self._lock:
            busy = self._in_flight > 0
        if busy or claimed:
            return False
        if self.options.max_tasks is not None and self._claimed_total >= self.options.max_tasks:
            logger.info("Worker %s reached --max-tasks %d.", self.id, self.options.max_tasks)
            return True
        if self.options.burst:
            # Paused queues don't count: a burst worker leaves their messages for later.
            return not self._active or not broker.has_pending(self._active,
                                                              self.options.burst_wait)
        return False

    def _held_tokens(self) -> list[str]:
        """Claim tokens of every message this worker holds: queued, running or unacked."""
        with self._inbox.mutex:
            queued = [m.claim_token for m in self._inbox.queue if m is not None]
        with self._lock:
            running = [task.message.claim_token for task in self._running.values()]
        unacked = self._acker.held_tokens() if self._acker is not None else []
        return sorted({*queued, *running, *unacked})

    def _heartbeat(self) -> None:
        broker.renew_leases(self._held_tokens(), self.settings.LEASE_SECONDS)
        broker.heartbeat_worker(self.id, self.stats.processed, self.stats.failed,
                                self._listening)

    def _report_overruns(self) -> None:
        """Log (once) and signal tasks past their timeout; in process mode, end them."""
        now = time.monotonic()
        with self._lock:
            overdue = [task for task in self._running.values()
                       if not task.reported and task.message.timeout is not None
                       and now - task.started > task.message.timeout]
            for task in overdue:
                task.reported = True
        for task in overdue:
            message, elapsed = task.message, now - task.started
            logger.warning("%s #%s has run %.0fs, past its timeout of %.0fs.",
                           message.task_name, message.id, elapsed, message.timeout)
            broker.send_robust(task_overran, self, message_id=message.id,
                               attempt=message.attempt, seconds=elapsed)
            if self.options.kill_on_timeout:
                self._abort_for_timeout(task, elapsed)

    def _abort_for_timeout(self, task: RunningTask, elapsed: float) -> None:
        """Fail the overdue message (so it is retried) and end this process at once.

        A thread can't be stopped from outside, so the process goes: the supervisor
        starts a fresh one. Other tasks running here are recovered by peers as lost.
        """
        message = task.message
        logger.error("%s #%s ran %.0fs, past its timeout of %.0fs: failing the attempt and "
                     "restarting this worker process.", message.task_name, message.id,
                     elapsed, message.timeout)
        runner = Runner(worker_id=self.id, host=self.host, pid=self.pid,
                        thread=threading.current_thread().name)
        error = TaskTimeout(f"ran {elapsed:.1f}s, past its timeout of {message.timeout}s; "
                            "its worker process was restarted")
        result = AttemptResult(started_at=task.started_at, error_class=_qualified_name(error),
                               error_message=str(error))
        try:
            broker.fail(message, runner, result)
            self._release_unstarted()
            if self._acker is not None:
                self._acker.stop()  # tasks that did finish are not run again
            broker.deregister_worker(self.id, self.stats.processed, self.stats.failed)
        except DatabaseError as exc:
            logger.warning("Could not record the timeout (%s); peers will recover the claims.",
                           exc)
        logging.shutdown()
        os._exit(EXIT_TIMEOUT)

    def _over_memory(self) -> bool:
        """Whether to stop claiming and drain, to be replaced: past ``--max-memory``.

        Judged only after a finished task (counted before its slot frees up), so a
        process that starts over the limit still runs one task per life.
        """
        limit = self.options.max_memory_mb
        if limit is None or not self.stats.processed:
            return False
        used = resident_memory_mb()
        if used <= limit:
            return False
        if not self.stop_request.is_set():
            logger.info("Worker %s uses %.0f MiB, over --max-memory %d: stopping gracefully "
                        "to be replaced.", self.id, used, limit)
            self.stop_request.set("max-memory")
        return True

    # ------------------------------------------------------------------ stopping

    def _wait_for_threads(self, deadline: float) -> None:
        """Join the task threads by ``deadline``, renewing leases meanwhile.

        A task finishing during the grace period keeps its claim: without heartbeats
        its lease would run out and a peer would start it a second time.
        """
        next_beat = time.monotonic()
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                if time.monotonic() >= next_beat:
                    try:
                        self._heartbeat()
                    except DatabaseError as exc:
                        logger.warning("Heartbeat failed while stopping (%s).", exc)
                        broker.close_if_broken()
                    next_beat = time.monotonic() + self.settings.HEARTBEAT_SECONDS
                thread.join(max(0.0, min(deadline, next_beat) - time.monotonic()))

    def _release_unstarted(self) -> None:
        """Give back the claimed messages no task thread has taken yet."""
        unstarted: list[ClaimedMessage] = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                unstarted.append(item)
        if not unstarted:
            return
        with self._lock:
            self._in_flight -= len(unstarted)
        try:
            count = broker.release(unstarted)
            self.stats.add(released=count)
            logger.info("Released %d claimed but unstarted message(s).", count)
        except DatabaseError as exc:
            logger.warning("Could not release %d unstarted message(s) (%s); peers will "
                           "recover them.", len(unstarted), exc)

    def _drain(self) -> int:
        """Release unstarted claims, wait for running tasks, deregister.

        Ends within GRACE_SECONDS plus STOP_STATEMENT_SECONDS (about): every statement
        from here on is bounded to end by then, acks included.
        """
        deadline = time.monotonic() + self.settings.GRACE_SECONDS
        broker.finish_by(deadline + STOP_STATEMENT_SECONDS)
        if self._acker is not None:
            self._acker.finish_by(deadline + STOP_STATEMENT_SECONDS)
        self._release_unstarted()
        for _ in self._threads:
            self._inbox.put(None)
        with self._lock:
            running = len(self._running)
        if running:
            logger.info("Waiting up to %.0fs for %d running task(s).",
                        self.settings.GRACE_SECONDS, running)
        self._wait_for_threads(deadline)
        if self._acker is not None:
            self._acker.stop()  # ack what finished, before deregistering
        abandoned = sum(thread.is_alive() for thread in self._threads)
        try:
            # Anything still claimed under our id that we don't hold (say, a claim whose
            # read-back failed) goes back now instead of waiting for its lease.
            unacked = self._acker.unacked_tokens() if self._acker is not None else []
            strays = broker.release_strays(self.id, keep=sorted({*self._held_tokens(),
                                                                 *unacked}))
            self.stats.add(released=strays)
            if strays:
                logger.warning("Released %d claim(s) this worker had lost track of.", strays)
        except DatabaseError as exc:
            logger.warning("Could not release stray claims (%s); their leases will run out.",
                           exc)
        self._give_up.set()
        if abandoned:
            logger.error("%d task(s) still running after the %.0fs grace period; exiting "
                         "anyway, peers will recover them.", abandoned,
                         self.settings.GRACE_SECONDS)
        if self.stats.unacked:
            logger.error("%d finished task(s) could not be acked; they stay claimed and will "
                         "run again when a peer recovers them.", self.stats.unacked)
        try:
            broker.deregister_worker(self.id, self.stats.processed, self.stats.failed)
        except DatabaseError as exc:
            logger.warning("Could not deregister worker %s (%s).", self.id, exc)
        logger.info("Worker %s stopped: %s", self.id, self.stats.summary())
        broker.send_robust(worker_stopped, self)
        return 1 if abandoned else 0
