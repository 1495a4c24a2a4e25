"""The worker process: one control thread that claims, N threads that run tasks.

The control thread (the main thread) owns the claiming connection: it claims batches,
renews leases and the worker's heartbeat, promotes due scheduled messages and, when the
recovery lock is free, sweeps the claims of vanished peers. Task threads run messages
and settle them on their own connections. The loop holds no SQL: it calls the broker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from django.db import DatabaseError

from .. import broker
from ..conf import get_settings
from ..log import one_line
from ..messages import ClaimedMessage
from ..registry import import_task_modules, registry
from ..signals import task_overran, worker_started
from . import draining, fatal, queues, schedules, sweep, topic_alerts, troubles
from .acker import Acker
from .budget import TaskBudget
from .due import Due
from .gate import SoloGate
from .holdings import Holdings
from .options import WorkerOptions
from .pumpclaim import PumpClaimer
from .stats import WorkerStats
from .stopping import RECYCLE_REASON, StopRequest
from .threads import run_task_thread
from .topics import TopicDuty
from .upkeep import Housekeeping, RateWatch

logger = logging.getLogger("django_mysqlq")

#: Re-exported for the supervisor, which reads a child's exit status.
EXIT_TIMEOUT = draining.EXIT_TIMEOUT


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
#: Seconds between two records of which messages started (recovery counts the attempt of a
#: lost message only if it started; one that started since is taken for unstarted).
MARK_SECONDS = 1.0


class Worker:
    """Runs tasks from the given queues until stopped (or drained, in burst mode)."""

    def __init__(self, options: WorkerOptions, budget: TaskBudget | None = None) -> None:
        self.options = options
        #: ``--max-tasks``: the process's, shared with the workers of its other databases.
        self.budget = budget or TaskBudget(options.max_tasks)
        self.settings = get_settings()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self.stats = WorkerStats()
        self.wakeup = threading.Event()
        self.stop_request = StopRequest(self.wakeup, on_force=lambda: draining.exit_now(self))
        self.give_up = threading.Event()
        self._rated = False  # set once the task modules are imported (run())
        # Housekeeping and the rate keys' reads wait a bounded time for a stranger's lock.
        self.housekeeping = Housekeeping(self.id, self.settings.UPKEEP_LOCK_WAIT_SECONDS)
        self.rate_watch = RateWatch(self.id, self.settings.UPKEEP_LOCK_WAIT_SECONDS)
        self.holdings = Holdings(self.stop_request.event, self.wakeup,
                                 fresh_seconds=2 * self.settings.HEARTBEAT_SECONDS,
                                 clock=broker.database_now)
        self.gate = SoloGate(self.stop_request.event)
        self.threads: list[threading.Thread] = []
        self._due = Due.starting_now(self.settings)
        self._poll = IDLE_BACKOFF_START
        self._park = PARK_START
        self._listening = False
        #: The last park found nothing ready and nobody woke it: the next park's own
        #: check covers the claim, so an idle worker costs one query per park.
        self._nothing_ready = False
        #: Ready rows none of which the last claim could take (another transaction holds
        #: them): parks pass over ids up to the first until the monotonic time, the
        #: second, instead of ending at once, again and again (``broker.ready_floor``).
        self._floor = (0, 0.0)
        #: Their highest id, read when the last park said 'ready' (else None).
        self._floor_seen: int | None = None
        self._reconnected = False
        #: The worker's queues minus those an operator paused, re-read every second while
        #: busy; a parked worker learns of a change from its park statement.
        self._active: list[str] = list(options.queues)
        self._paused_seen: str | None = None
        batch = self.settings.ACK_BATCH_SIZE
        self.acker = Acker(batch, self.settings.ACK_DELAY_SECONDS, self.give_up,
                           self.stats.add, nudge=self.wakeup.set,
                           idle=self._nothing_waiting,
                           alias=options.database) if batch > 1 else None
        #: Counts database outages seen by the control loop; task threads recheck on change.
        self.outages = 0
        #: The consumer groups it serves (pumped before claims) and its broadcast reader.
        import_task_modules()  # the subscriptions TopicDuty reads (TASK_MODULES too)
        self.topics = TopicDuty(options.queues, self.stop_request.event, self.settings,
                                keep=options.claim_batch, broadcast=options.broadcast)
        self.claimer = PumpClaimer(self)

    def _nothing_waiting(self) -> bool:
        """No claimed message waits for a task thread (the one being acked still counts)."""
        return self.holdings.in_flight <= self.options.concurrency

    # ------------------------------------------------------------------ control loop

    def run(self) -> int:
        """Work until stopped; return the process exit status."""
        self.stop_request.install(self.options.supervised)
        # This thread's statements go there (given back after: a worker run in-process).
        with broker.on_alias(self.options.database):
            broker.own_connection(self.options.database)  # claims, renews, recovers: READ COMMITTED
            import_task_modules()
            # Its code has rate-limited tasks: it claims throttled messages too, and its parks
            # end when a rate key may start its next one.
            self._rated = registry.rate_limited()
            self._start()  # raises WorkerCannotRun if the database can't serve it
            try:
                self._loop()
            finally:
                status = draining.drain(self)
                draining.lift_bound()
        return status

    def _start(self) -> None:
        self._call_until_up(lambda: broker.register_worker(
            self.id, self.host, self.pid, self.options.queues, self.options.concurrency))
        try:
            self._call_until_up(self.topics.start)
            logger.info("Worker %s started: queues=%s concurrency=%d batch=%d liveness=%s%s",
                        self.id, ",".join(self.options.queues), self.options.concurrency,
                        self.options.claim_batch, self.settings.LIVENESS,
                        " (burst)" if self.options.burst else "")
            self._call_until_up(lambda: schedules.start(self.id))
            if self.options.report_queues:
                queues.report(f"Worker {self.id}", self.options.queues)
        except BaseException:
            draining.deregister(self)  # its row must not count as serving its queues
            raise
        if self.acker is not None:
            self.acker.start()
        for index in range(self.options.concurrency):
            thread = threading.Thread(target=run_task_thread, args=(self,),
                                      name=f"mysqlq-task-{index}", daemon=True)
            thread.start()
            self.threads.append(thread)
        broker.send_robust(worker_started, self)

    def _call_until_up(self, operation: object) -> None:
        delay = ERROR_BACKOFF[0]
        while not self.stop_request.is_set():
            try:
                operation()  # type: ignore[operator]
                return
            except DatabaseError as exc:
                fatal.check(exc, started=False, burst=self.options.burst)
                self._database_trouble(exc, delay)
                delay = min(delay * 2, ERROR_BACKOFF[1])

    def _database_trouble(self, exc: DatabaseError, delay: float) -> None:
        self.stats.add(db_errors=1)
        self.outages += 1
        # The claims' owner connection may be gone: a peer may be recovering them. Nothing
        # new starts until a lease renewal on a new connection says which are still ours.
        self.holdings.unverified()
        self._due.beat = 0.0
        problem = fatal.describe(exc)
        if problem is not None:  # a daemon rides out a refused login or grant: say so loudly
            logger.error("%s Retrying in %.1fs.", problem, delay)
        else:
            logger.warning("Database error in the worker loop (%s); retrying in %.1fs.",
                           one_line(str(exc)), delay)
        broker.close_if_broken()
        self.wakeup.wait(delay)
        self.wakeup.clear()

    def _loop(self) -> None:
        error_delay = ERROR_BACKOFF[0]
        while not self.stop_request.is_set():
            # Cleared before looking, so a task finishing meanwhile wakes the next wait.
            self.wakeup.clear()
            try:
                self._upkeep()
                pumped = self.topics.pump(claimer=self.claimer)
                claiming = bool(pumped) or not self._nothing_ready
                if claiming and self._listening:
                    # Parked no more: a producer's wake-up must go to a parked worker.
                    broker.listen(self.id, False)
                    self._listening = False
                claimed = self.topics.taken + (self._claim() if claiming else 0)
                self._nothing_ready = False
                if self._finished(claimed):
                    return
                seen, self._floor_seen = self._floor_seen, None
                if claimed:
                    self._poll = IDLE_BACKOFF_START
                    self._floor = (0, 0.0)
                else:
                    if seen is not None:  # the park saw ready rows, none could be taken
                        self._floor = (seen, time.monotonic() + self.settings.POLL_SECONDS)
                    self._idle()
                error_delay = ERROR_BACKOFF[0]
            except DatabaseError as exc:
                if broker.was_interrupted(exc):
                    continue  # a late wake-up cut a statement short: just go round again
                fatal.check(exc, started=True, burst=self.options.burst)
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
            self.heartbeat()
            due.beat = due.verify = now + conf.HEARTBEAT_SECONDS
        elif (now >= due.verify and self.holdings.has_unstarted()) \
                or self.holdings.awaiting_check():
            # Claims wait here: check them more often than a peer sweeps, so a lost one
            # is known before it would start.
            self._renew()
            due.verify = now + conf.RECOVERY_SECONDS / 2
        if now >= due.mark:
            self._mark_starts()
            due.mark = now + MARK_SECONDS
        if now >= due.recovery and not self._listening:
            # (A parked worker's next park checks whether a sweep is needed at all.)
            self._sweep(now)
        if broker.is_recovery_leader() and now >= due.stale_check:
            # Stale workers, retention, repairs (a step on a locked table waits next round).
            self.housekeeping.leader_round(self.host, self.pid, conf.LEASE_SECONDS)
            due.stale_check = now + conf.LEASE_SECONDS
        if now >= due.paused_check and not self._nothing_ready:
            # (After a park that slept through nothing is claimed, so this can wait.)
            self._refresh_paused()
            due.paused_check = now + PAUSE_CHECK_SECONDS
        if now >= due.promote:
            # Due messages, recurring tasks' due occurrences (once, whoever fires them).
            self.housekeeping.promotion_round()
            due.promote = now + conf.POLL_SECONDS
        self._report_overruns()
        if now >= due.summary:
            self.stats.log_summary(self.id)  # with the server's purge lag
            due.summary = now + conf.SUMMARY_SECONDS

    def _sweep(self, now: float) -> None:
        """Recover vanished workers' claims (the leader), or see if the leader is gone."""
        sweep.recover_lost(self.stats, self.id)
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
        # Gated successes waiting for their ack count: that ack may make a gate's next
        # message ready, and the acker then nudges this loop (a parked one would not hear
        # it). Other unacked successes don't: staying awake for them turned every quiet
        # moment into polling, and a producer's wake-up into a 20 ms wait.
        busy = self.holdings.in_flight > 0 or (
            self.acker is not None and self.acker.gated_unacked)
        now = time.monotonic()
        parking = not busy and bool(self._active) and broker.wakeups_possible()
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
            # Tasks finishing set the event; otherwise poll with a growing pause, or until
            # a rate-limited key may start its next message.
            pause = min(self._poll, until_upkeep)
            # (Every thread busy: nothing can be claimed before one finishes, and that
            # wakes this wait; asking the rate keys then cost a statement per claim.)
            if self._rated and self._active \
                    and self.holdings.in_flight < self.options.concurrency:
                soonest = self.rate_watch.next_start(
                    self._active, idle=self.holdings.in_flight == 0)
                if soonest is not None:
                    pause = min(pause, max(0.0, soonest))
            self.wakeup.wait(pause)
            self._poll = min(self._poll * 2, conf.POLL_SECONDS)
            return
        if not self._listening:
            broker.listen(self.id, True)
            self._listening = True
            self._park = PARK_START
        if self.topics.pump(force=True, claimer=self.claimer) or self.topics.sequencer_busy:
            # Listening first: a publish committed after this pump wakes the park. Another
            # member stamping offsets wakes nobody: look again after a short pause.
            broker.listen(self.id, False)
            self._listening = False
            if self.topics.sequencer_busy:
                self.wakeup.wait(self.topics.busy_pause())
            return
        floor, until = self._floor
        result, paused = self.rate_watch.park(self._active, min(self._park, until_upkeep),
                                              sweep_check, self._rated,
                                              watched=self.options.queues, worker_id=self.id,
                                              ready_after=floor if now < until else 0)
        if paused is not None and paused != self._paused_seen:
            self._paused_seen = paused
            self._refresh_paused()
        # Short first parks: a producer may trust a 'nobody listens' answer briefly.
        self._park = min(self._park * 2, conf.HEARTBEAT_SECONDS)
        if result == "sweep" or (result == "interrupted" and sweep_check):
            self._sweep(time.monotonic())
        if result in ("ready", "woken", "interrupted", "due"):
            self.topics.woken()
            if result == "due":
                due.promote = 0.0
            broker.listen(self.id, False)
            self._listening = False
            if result == "ready":  # (if the claim takes none of them: see _floor)
                self._floor_seen = broker.ready_floor(self._active)
        elif result == "sweep":
            # Not a wake-up: stay parked; the next park looks for ready work first.
            self._nothing_ready = True
        else:
            # Slept through: nothing was ready or due when the park began, and a producer
            # or the due time (a rate-limited key's next start too: 'due') would have cut
            # it short. Parks watch the schedule, so the periodic promotion can wait too.
            self._nothing_ready = True
            due.promote = max(due.promote, time.monotonic() + conf.POLL_SECONDS)

    def _room(self) -> int:
        """How many messages it would claim now (before ``--max-tasks``)."""
        options = self.options
        in_flight = self.holdings.in_flight
        if in_flight >= options.concurrency or self._over_memory() or self.gate.solo_pending:
            return 0
        room = max(options.concurrency, options.claim_batch) - in_flight
        return max(0, min(options.claim_batch, room))

    def _claim(self) -> int:
        """Claim as many messages as there is room for; hand them to the task threads."""
        in_flight = self.holdings.in_flight
        wanted = self._room()
        if wanted <= 0 or not self._active or (wanted := self.budget.reserve(wanted)) <= 0:
            return 0
        messages: list[ClaimedMessage] = []
        try:
            order = self.topics.claim_order(self._active, self.holdings.held_queues)
            messages = broker.claim(order, wanted, self.id, self.settings.LEASE_SECONDS)
            if self._rated and len(messages) < wanted:  # (none while its table is locked)
                messages += self.rate_watch.claim(self._active, wanted - len(messages),
                                                  self.settings.LEASE_SECONDS,
                                                  idle=in_flight == 0 and not messages)
        finally:
            # Held even when the throttled claim fails after the plain one committed (a
            # producer's late wake-up, KILL QUERY, cuts it short and the loop just goes
            # round again): not held, that batch would never start nor be renewed, and its
            # lease would run out under a live worker.
            self.budget.give_back(wanted - len(messages))
            if messages:
                self.holdings.add(messages)
        return len(messages)

    def _finished(self, claimed: int) -> bool:
        """Whether a burst or max-tasks worker has nothing left to do."""
        if self.holdings.in_flight > 0 or claimed:
            return False
        if self.budget.spent:
            logger.info("Worker %s reached --max-tasks %d.", self.id, self.options.max_tasks)
            return True
        if self.options.burst:
            # Paused queues don't count: a burst worker leaves their messages for later.
            # Throttled messages count only for a worker that can claim them. A member
            # of a consumer group ends once the group has caught up (TopicDuty.behind).
            return not self._active or not (broker.has_pending(
                self._active, self.options.burst_wait, throttled=self._rated)
                or self.topics.behind(self._active))
        return False

    def held_tokens(self) -> list[str]:
        """Claim tokens of every message this worker holds: queued, running or unacked."""
        return sorted({token for _, token in self._held_pairs()})

    def _held_pairs(self) -> list[tuple[int, str]]:
        unacked = self.acker.held_pairs() if self.acker is not None else []
        return [*self.holdings.held_pairs(), *unacked]

    def heartbeat(self) -> None:
        """Renew the leases (checking them) and the worker's row."""
        self._renew()
        broker.heartbeat_worker(self.id, self.stats.processed, self.stats.failed,
                                self._listening,
                                troubles.now(self.housekeeping, self.topics, self.rate_watch))

    def _renew(self) -> None:
        """Renew the held claims' leases; any a peer took meanwhile must not start here.

        The renewal's row count says whether every claim is still ours; only when it
        falls short is the database asked which ones.
        """
        held = self._held_pairs()
        if broker.renew_leases(held, self.settings.LEASE_SECONDS) < len(held):
            lost = set(held) - broker.claims_held(held)
            unstarted = self.holdings.claims_lost(lost)
            if unstarted:
                logger.warning("Worker %s: %d claimed message(s) were recovered by a peer "
                               "before they started here (this worker's connection was lost, "
                               "or its lease ran out); they won't run here.", self.id,
                               unstarted)
        self.holdings.verified()

    def _mark_starts(self) -> None:
        """Record in the database which held messages started since the last time."""
        starts = self.holdings.unmarked_starts()
        if starts:
            broker.mark_started(starts)
            self.holdings.marked([message for message, _ in starts])

    def _report_overruns(self) -> None:
        """Log (once) and signal tasks past their timeout; in process mode, end them."""
        now = time.monotonic()
        overdue = [task for task in self.holdings.running()
                   if not task.reported and task.message.timeout is not None
                   and now - task.started > task.message.timeout]
        for task in overdue:
            task.reported = True
            message, elapsed = task.message, now - task.started
            logger.warning("%s #%s has run %.0fs, past its timeout of %.0fs.",
                           message.task_name, message.id, elapsed, message.timeout)
            broker.send_robust(task_overran, self, message_id=message.id,
                               attempt=message.attempt, seconds=elapsed)
            topic_alerts.report_overran(message, elapsed)
            if self.options.kill_on_timeout:
                draining.abort_for_timeout(self, task, elapsed)

    def _over_memory(self) -> bool:
        """Whether to stop claiming and drain, to be replaced: past ``--max-memory``.

        Judged only after a finished task (counted before its slot frees up), so a
        process that starts over the limit still runs one task per life.
        """
        limit = self.options.max_memory_mb
        if limit is None or not self.stats.ran:
            return False
        used = resident_memory_mb()
        if used <= limit:
            return False
        if not self.stop_request.is_set():
            logger.info("Worker %s uses %.0f MiB, over --max-memory %d: stopping gracefully "
                        "to be replaced.", self.id, used, limit)
            self.stop_request.set(RECYCLE_REASON)
        return True
