"""Task threads: each takes a claimed message, checks it is still its to run, and runs it."""

from __future__ import annotations

import datetime as dt
import functools
import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from .. import broker
from ..log import quietly
from ..messages import ClaimedMessage, Runner
from ..models import Outcome
from .executor import ABORTED, execute, settle
from .holdings import Verdict

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger("django_mysqlq")

#: An idle thread's connection is checked before its next task after this many seconds.
IDLE_CHECK_SECONDS = 1.0
#: What each recorded outcome adds to the worker's counters.
COUNTERS: dict[str, str] = {
    Outcome.SUCCEEDED: "succeeded",
    Outcome.RETRIED: "retried",
    Outcome.FAILED: "dead",
    Outcome.DEFERRED: "deferred",
    Outcome.LOST: "lost",
}


def run_task_thread(worker: Worker) -> None:
    """Run messages until the worker closes the inbox."""
    broker.bind_alias(worker.options.database)  # settle on the worker's database
    runner = Runner(worker_id=worker.id, host=worker.host, pid=worker.pid,
                    thread=threading.current_thread().name)
    last_used = time.monotonic()
    outages_seen = worker.outages
    try:
        holdings, concurrency = worker.holdings, worker.options.concurrency
        while (message := holdings.next()) is not None:
            if outages_seen != worker.outages \
                    or time.monotonic() - last_used > IDLE_CHECK_SECONDS:
                # An idle connection may have died with the server: check it first, so
                # the task's first query doesn't fail on it and spend an attempt.
                outages_seen = worker.outages
                try:
                    broker.ensure_usable()
                except DatabaseError:
                    broker.close_if_broken()
            _run_one(worker, message, runner)
            # The control loop claims only once a thread can take more: waking it after
            # every message would cost a loop round (and the GIL) per message for nothing.
            if holdings.in_flight < concurrency:
                worker.wakeup.set()
            last_used = time.monotonic()
    finally:
        connections.close_all()


def _run_one(worker: Worker, message: ClaimedMessage, runner: Runner) -> None:
    # A message lost with its worker before runs alone (see gate.SoloGate), and only once
    # every success before it is acked: if it crashes again, it takes none of them along.
    solo = message.losses > 0
    if not worker.gate.enter(solo):
        worker.holdings.give_back(message)  # stopping
        return
    if solo and not _acked_so_far(worker):
        worker.gate.leave(solo)
        worker.holdings.give_back(message)  # stopping
        return
    try:
        _run_entered(worker, message, runner, solo)
    finally:
        worker.gate.leave(solo)


def _run_entered(worker: Worker, message: ClaimedMessage, runner: Runner, solo: bool) -> None:
    """Run a message whose turn came: unless the claim was lost, or the worker stops."""
    verdict, started_at = worker.holdings.begin(message)
    if verdict is Verdict.STOPPING:
        worker.holdings.give_back(message)
        return
    if verdict is Verdict.LOST:
        _skip_lost(worker, message)
        return
    if solo:
        recorded = _record_start(worker, message, started_at)
        if recorded is None:
            _release(worker, message)
            return
        if not recorded:
            _skip_lost(worker, message)
            return
    handover = worker.acker.handover() if worker.acker is not None else None
    try:
        outcome = execute(message, runner, worker.give_up, handover, started_at,
                          functools.partial(worker.holdings.may_end, message),
                          functools.partial(worker.holdings.began, message))
    except Exception:  # noqa: BLE001 - logged (quietly: see log.quietly)
        # execute() records every task failure itself; this is a bug or an outage it
        # could not ride out. The claim stays; a peer recovers it.
        quietly(logger.exception, "Unexpected error while running %s #%s",
                message.task_name, message.id)
        outcome = ""
    counter = COUNTERS.get(outcome)
    # A success handed to the acker is counted by the acker, once its ack is written; an
    # attempt failed for its timeout, by the control thread that failed it.
    if outcome == ABORTED:
        pass
    elif counter is not None and not (handover is not None and handover.used):
        worker.stats.add(ran=1, **{counter: 1})
    else:
        worker.stats.ran_one()
    if solo and handover is not None and handover.used:
        # A suspect's own success is acked before anything starts after it.
        _acked_so_far(worker)
    worker.holdings.finish(message)


def _acked_so_far(worker: Worker) -> bool:
    """Have the acker write the successes handed over so far and wait for it; False if the
    worker stops first (its stop writes them)."""
    return worker.acker is None or worker.acker.flush(worker.stop_request.event)


def _record_start(worker: Worker, message: ClaimedMessage,
                  started_at: dt.datetime) -> bool | None:
    """Record a solo message's start before it runs, so that if it takes the process down,
    recovery counts the attempt it spent. False if the claim is no longer ours, None if
    the database could not be reached. (The control loop's round of marks may have
    recorded it already, between ``begin`` and here: then it is.)"""
    if not any(start[0].id == message.id for start in worker.holdings.unmarked_starts()):
        return True
    written = settle(lambda: broker.mark_started([(message, started_at)]),
                     f"the start of {message.task_name} #{message.id}", worker.give_up)
    if written is None:
        return None
    worker.holdings.marked([message])
    return bool(written)


def _release(worker: Worker, message: ClaimedMessage) -> None:
    """Not run after all: give the claim back (or leave it to its lease and a peer)."""
    try:
        broker.release([message])
    except DatabaseError as exc:
        logger.warning("Could not give %s #%s back (%s); its lease will run out and a peer "
                       "will recover it.", message.task_name, message.id, exc)
    worker.holdings.finish(message)


def _skip_lost(worker: Worker, message: ClaimedMessage) -> None:
    logger.warning("%s #%s: a peer recovered this worker's claim before it started here (the "
                   "worker's connection was lost, or its lease ran out); it runs there, not "
                   "here.", message.task_name, message.id)
    worker.stats.add(skipped=1)
    worker.holdings.finish(message)
