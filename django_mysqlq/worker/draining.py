"""How a worker process ends: gracefully, after a task overran, or at once on a second signal.

Whatever the way out, claimed messages that no task thread started go back to the queue
with their attempt, and the worker's row says it stopped: nothing waits for a lease to run
out when the worker can still say so itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, connections

from .. import broker
from ..exceptions import TaskTimeout
from ..messages import AttemptResult, ClaimedMessage, Runner
from ..models import Outcome
from ..signals import worker_stopped
from . import childreport, timeout_end
from .attempt_log import AttemptLine
from .executor import NOT_RECORDED
from .holdings import RunningTask
from .stopping import STOP_STATEMENT_SECONDS
from .threads import COUNTERS

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger("django_mysqlq")

#: Exit status of a worker process ended because a task ran past its timeout.
EXIT_TIMEOUT = 75
#: Exit status of a ``--burst`` run during which messages went dead (``--exit-zero``: 0).
EXIT_DEAD = 3
#: Exit status after a second signal: running tasks' claims are left to peers.
FORCED_EXIT_STATUS = 1
#: Longest a second signal waits for the unstarted claims to be released.
FORCED_EXIT_SECONDS = 3.0
#: Longest a stop waits for a broadcast handler running at the signal (within the grace
#: period, counted from the signal's drain; tasks are waited for meanwhile).
BROADCAST_FINISH_SECONDS = 5.0


def release_unstarted(worker: Worker) -> int:
    """Give back the claimed messages no task thread started; return how many."""
    return _release(worker, worker.holdings.take_unstarted())


def _release(worker: Worker, unstarted: list[ClaimedMessage]) -> int:
    if not unstarted:
        return 0
    try:
        count = broker.release(unstarted)
    except DatabaseError as exc:
        logger.warning("Could not release %d unstarted message(s) (%s); peers will recover "
                       "them.", len(unstarted), exc)
        return 0
    finally:
        worker.holdings.released(unstarted)
    logger.info("Released %d claimed but unstarted message(s).", count)
    worker.stats.add(released=count)
    return count


def resign_lead(worker: Worker) -> None:
    """A stopping recovery leader gives the lead up first: its lock would otherwise live on
    with its connection through the whole drain, and no peer could sweep meanwhile."""
    try:
        if broker.resign_recovery_lead():
            logger.info("Worker %s: gave up the recovery lead for its stop; a peer takes "
                        "it over.", worker.id)
    except DatabaseError as exc:
        logger.warning("Worker %s could not give up the recovery lead (%s); peers take it "
                       "over once this process is gone.", worker.id, exc)
        broker.close_if_broken()


def _wait_for_threads(worker: Worker, deadline: float) -> None:
    """Join the task threads by ``deadline``, renewing leases meanwhile.

    A task finishing during the grace period keeps its claim: without heartbeats its
    lease would run out and a peer would start it a second time.
    """
    next_beat = time.monotonic()
    for thread in worker.threads:
        while thread.is_alive() and time.monotonic() < deadline:
            if time.monotonic() >= next_beat:
                try:
                    worker.heartbeat()
                except DatabaseError as exc:
                    logger.warning("Heartbeat failed while stopping (%s).", exc)
                    broker.close_if_broken()
                next_beat = time.monotonic() + worker.settings.HEARTBEAT_SECONDS
            thread.join(max(0.0, min(deadline, next_beat) - time.monotonic()))


def _wait_for_broadcast(worker: Worker, until: float) -> None:
    """Let a broadcast handler running at the signal finish (the reader starts none after
    it), up to ``until``: the reader is a daemon thread, killed mid-handler at exit."""
    reader = worker.topics.reader
    if reader is None or not reader.is_alive():
        return
    reader.halted.set()  # (a --burst run's end sets no stop event)
    if not reader.finish(until - time.monotonic()):
        logger.warning("A broadcast handler was still running %.0fs after the stop; exiting "
                       "anyway (it is cut off).", BROADCAST_FINISH_SECONDS)


def drain(worker: Worker) -> int:
    """Release unstarted claims, wait for running tasks, deregister; the exit status.

    Ends within ``GRACE_SECONDS`` plus ``STOP_STATEMENT_SECONDS`` (about): every statement
    from here on is bounded to end by then, acks included, even when the database hangs
    on a lock or is gone.
    """
    grace = worker.settings.GRACE_SECONDS
    started = time.monotonic()
    deadline = started + grace
    broker.finish_by(deadline + STOP_STATEMENT_SECONDS)
    if worker.acker is not None:
        worker.acker.finish_by(deadline + STOP_STATEMENT_SECONDS)
    resign_lead(worker)
    release_unstarted(worker)
    worker.holdings.close(len(worker.threads))
    running = len(worker.holdings.running())
    if running:
        logger.info("Waiting up to %.0fs for %d running task(s).", grace, running)
    _wait_for_threads(worker, deadline)
    _wait_for_broadcast(worker, min(deadline, started + BROADCAST_FINISH_SECONDS))
    release_unstarted(worker)  # what threads took but gave back unstarted meanwhile
    if worker.acker is not None:
        worker.acker.stop()  # ack what finished, before deregistering
    abandoned = sum(thread.is_alive() for thread in worker.threads)
    try:
        # Anything still claimed under our id that we don't hold (say, a claim whose
        # read-back failed) goes back now instead of waiting for its lease.
        # Successes whose ack could not be written ran: a peer recovers them and counts
        # the attempt, so they are kept too.
        unacked = worker.acker.unacked_tokens() if worker.acker is not None else []
        strays = broker.release_strays(worker.id, keep=sorted({*worker.held_tokens(),
                                                               *unacked}))
        worker.stats.add(released=strays)
        if strays:
            logger.warning("Released %d claim(s) this worker had lost track of.", strays)
    except DatabaseError as exc:
        logger.warning("Could not release stray claims (%s); their leases will run out.", exc)
    worker.give_up.set()
    if abandoned:
        logger.error("%d task(s) still running after the %.0fs grace period; exiting anyway, "
                     "peers will recover them.", abandoned, grace)
    if worker.stats.unacked:
        logger.error("%d finished task(s) could not be acked; they stay claimed and will run "
                     "again when a peer recovers them.", worker.stats.unacked)
    deregister(worker)
    logger.info("Worker %s stopped: %s", worker.id, worker.stats.summary())
    broker.send_robust(worker_stopped, worker)
    return 1 if abandoned else _burst_status(worker)


def _burst_status(worker: Worker) -> int:
    """``EXIT_DEAD`` when a ``--burst`` run left messages dead, so a script notices."""
    options, dead = worker.options, worker.stats.dead
    if not options.burst or not dead or options.exit_zero:
        return 0
    logger.warning("Worker %s: %d message(s) went dead during this --burst run; exiting with "
                   "status %d (--exit-zero exits 0).", worker.id, dead, EXIT_DEAD)
    return EXIT_DEAD


def deregister(worker: Worker) -> None:
    try:
        broker.deregister_worker(worker.id, worker.stats.processed, worker.stats.failed)
    except DatabaseError as exc:
        logger.warning("Could not deregister worker %s (%s).", worker.id, exc)


def abort_for_timeout(worker: Worker, task: RunningTask, elapsed: float) -> None:
    """Fail the overdue message (so it is retried) and end this process at once.

    A thread can't be stopped from outside, so the process goes: the supervisor starts a
    fresh one. Other tasks running here are recovered by peers as lost. The attempt gets
    its line, its count and its ``task_finished`` like any other (``timeout_end``), and
    the count goes to the supervisor (``childreport``): a death here makes a ``--burst``
    run exit ``EXIT_DEAD``.

    The task may end meanwhile: whichever comes first settles the attempt, once
    (``Holdings.abort``/``may_end``). If its thread was first (it is acking or failing
    it), nothing is stuck: the attempt ends as it ran and this process goes on. If the
    abort was, the task's late end records, logs and counts nothing.
    """
    message = task.message
    if not worker.holdings.abort(message):
        logger.warning("%s #%s ended as its timeout was acted on: its attempt is recorded "
                       "as it ended, and this worker process goes on.", message.task_name,
                       message.id)
        return
    logger.error("%s #%s ran %.0fs, past its timeout of %.0fs: failing the attempt and "
                 "restarting this worker process.", message.task_name, message.id, elapsed,
                 message.timeout)
    line = AttemptLine(message, began=task.started)
    line.stop_clock()
    runner = Runner(worker_id=worker.id, host=worker.host, pid=worker.pid,
                    thread=threading.current_thread().name)
    error = TaskTimeout(f"ran {elapsed:.1f}s, past its timeout of {message.timeout}s; its "
                        "worker process was restarted")
    result = AttemptResult(started_at=task.started_at,
                           error_class=f"{type(error).__module__}.{type(error).__qualname__}",
                           error_message=str(error))
    # Bounded like a stop's last statements: a hung ack or lock wait must not keep a
    # process that is going anyway (the acker's join would otherwise wait for ever).
    end = time.monotonic() + STOP_STATEMENT_SECONDS
    broker.finish_by(end)
    if worker.acker is not None:
        worker.acker.finish_by(end)
    outcome: str | None = None
    try:
        outcome = broker.fail(message, runner, result)
        _timed_out(worker, line, outcome, result)
        release_unstarted(worker)
        if worker.acker is not None:
            worker.acker.stop()  # tasks that did finish are not run again
        broker.deregister_worker(worker.id, worker.stats.processed, worker.stats.failed)
    except DatabaseError as exc:
        logger.warning("Could not record the timeout (%s); peers will recover the claims.",
                       exc)
        if outcome is None:
            outcome = str(Outcome.LOST)
            _timed_out(worker, line, outcome, result, NOT_RECORDED)
    # Last, with the claims settled: what a receiver does delays nothing but this exit.
    timeout_end.tell_finished(task, outcome, error)
    childreport.send()
    logging.shutdown()
    os._exit(EXIT_TIMEOUT)


def _timed_out(worker: Worker, line: AttemptLine, outcome: str, result: AttemptResult,
               detail: str = "") -> None:
    """The line and the count of an attempt failed for its timeout, as any failed
    attempt's (``outcome``: what ``broker.fail`` wrote, or ``lost``)."""
    if outcome == Outcome.FAILED:
        detail = "now dead: no attempts left"
    elif outcome == Outcome.LOST and not detail:
        detail = ("failed after its claim was recovered by a peer; its new owner decides "
                  "what happens next")
    line.write(outcome, result, detail)
    worker.stats.add(ran=1, **{COUNTERS[outcome]: 1})


def exit_now(*workers: Worker) -> None:
    """A second signal: release what had not started, deregister, and exit at once.

    Runs on a thread of its own per worker (one per database; a connection of its own:
    the main thread may be in the middle of a statement on its connection), bounded by
    ``FORCED_EXIT_SECONDS``. The claims of running tasks are left: peers recover them.
    """
    def release_and_deregister(worker: Worker) -> None:
        broker.bind_alias(worker.options.database)
        try:
            # Includes a release the first signal's drain had begun: the main thread,
            # now in this signal handler, will never finish it.
            _release(worker, worker.holdings.unstarted_for_forced_exit(FORCED_EXIT_SECONDS / 3))
            deregister(worker)
        finally:
            connections.close_all()

    helpers = [threading.Thread(target=release_and_deregister, args=(worker,),
                                name="mysqlq-exit", daemon=True) for worker in workers]
    for helper in helpers:
        helper.start()
    deadline = time.monotonic() + FORCED_EXIT_SECONDS
    for helper in helpers:
        helper.join(max(0.0, deadline - time.monotonic()))
    childreport.send()
    logging.shutdown()
    os._exit(FORCED_EXIT_STATUS)


def lift_bound() -> None:
    """Lift the stop's bound on this thread's statements once the worker has ended: run
    on the caller's thread (``call_command('runqueueworker')`` in a script or a test),
    the thread goes on, and its next lock wait must not end at the stop's deadline."""
    try:
        broker.finish_by(None)
    except (DatabaseError, InterfaceError):  # gone with the server: its session with it
        broker.close_if_broken()
