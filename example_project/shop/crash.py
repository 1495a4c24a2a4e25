"""The demo's crash: a worker killed with SIGKILL mid-run, and how its messages came back.

``kill_when_holding`` is ``manage.py demokill``: it waits until a running worker holds
claimed messages, at least one of them started, kills it with ``kill -9`` (no signal
handler, no graceful stop, no ack) and records on the demo run what it left behind.
``recovery_of`` reads the rest from the queue's history: each claim the dead worker
left gets a ``lost`` attempt row written by the peer that recovered it (its
``finished_at`` is the moment of the recovery), and then the attempts of its next run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import socket
import time

from django_mysqlq import broker
from django_mysqlq.broker.recover import NOT_STARTED
from django_mysqlq.models import Attempt, Message, MessageStatus, Outcome, Worker

from .models import DemoRun


class CrashError(Exception):
    """The demo could not stage its crash (no such worker, or it never held a claim)."""


def kill_when_holding(run: DemoRun, pid: int, min_claims: int = 1,
                      timeout: float = 60.0) -> DemoRun:
    """SIGKILL the worker process ``pid`` once it holds ``min_claims`` claimed messages,
    one of them started; record who, when and how many claims it left on ``run``."""
    deadline = time.monotonic() + timeout
    worker_id = None
    while time.monotonic() < deadline:
        if worker_id is None:
            worker_id = (Worker.objects.running().filter(host=socket.gethostname(), pid=pid)
                         .values_list("id", flat=True).first())
        if worker_id is not None:
            claims = Message.objects.claimed().filter(worker_id=worker_id)
            if (claims.count() >= min_claims
                    and claims.filter(started_at__isnull=False).exists()):
                break
        time.sleep(0.01)
    else:
        raise CrashError(
            f"Worker process {pid} never held {min_claims} claimed message(s) with one "
            f"started within {timeout:g}s ({'not registered' if worker_id is None else worker_id})"
            ": is it running, and does its queue have work?")
    os.kill(pid, signal.SIGKILL)
    run.killed_at = broker.database_now()
    run.killed_worker = worker_id
    # What it left behind: its claims stay claimed until a peer recovers them.
    run.killed_holding = Message.objects.claimed().filter(worker_id=worker_id).count()
    run.save(update_fields=["killed_at", "killed_worker", "killed_holding"])
    return run


@dataclasses.dataclass
class Recovery:
    """What happened to the claims of the worker the demo killed."""

    worker: str
    killed_at: dt.datetime
    #: Claimed messages it left behind, counted right after the kill.
    holding: int
    #: message id -> seconds from the kill to its recovery (its ``lost`` row).
    recovered_after: dict[int, float]
    #: Messages of the dead worker that had started (their run spent an attempt).
    started: int
    #: Workers that ran the recovered messages again, and how many each.
    rerun_by: dict[str, int]
    #: Recovered messages with no later success or death: lost work.
    unfinished: list[int]

    @property
    def slowest(self) -> float:
        return max(self.recovered_after.values(), default=0.0)

    @property
    def fastest(self) -> float:
        return min(self.recovered_after.values(), default=0.0)


def recovery_of(run: DemoRun) -> Recovery | None:
    """The recovery of the run's killed worker, or None when the run killed nobody."""
    if run.killed_at is None:
        return None
    # A lost claim's row names the lost worker (a last attempt that had started is
    # ``failed`` rather than ``lost``: the message is dead, which is an end too).
    lost = list(Attempt.objects.filter(worker_id=run.killed_worker, error_class="WorkerLost")
                .values_list("id", "message_id", "finished_at", "error_message"))
    recovered_after = {message_id: (finished - run.killed_at).total_seconds()
                       for _, message_id, finished, _ in lost}
    rerun_by: dict[str, int] = {}
    unfinished = []
    for row_id, message_id, _, _ in sorted(lost, key=lambda row: row[1]):
        later = (Attempt.objects.for_message(message_id).filter(id__gt=row_id)
                 .filter(outcome__in=(Outcome.SUCCEEDED, Outcome.FAILED, Outcome.RETRIED))
                 .order_by("id"))
        runner = later.values_list("worker_id", flat=True).first()
        if runner:
            rerun_by[runner] = rerun_by.get(runner, 0) + 1
        finished = later.filter(outcome=Outcome.SUCCEEDED).exists() or Message.objects.filter(
            pk=message_id, status=MessageStatus.DEAD).exists()
        if not finished:
            unfinished.append(message_id)
    return Recovery(
        worker=run.killed_worker, killed_at=run.killed_at, holding=run.killed_holding,
        recovered_after=recovered_after,
        started=sum(1 for *_, note in lost if NOT_STARTED not in note),
        rerun_by=rerun_by, unfinished=unfinished,
    )


def recovery_problems(recovery: Recovery | None) -> list[str]:
    """What the recovery didn't do: every claim back in the queue, and run to its end."""
    if recovery is None:
        return []
    problems = []
    if len(recovery.recovered_after) != recovery.holding:
        problems.append(f"The killed worker left {recovery.holding} claimed message(s), but "
                        f"{len(recovery.recovered_after)} were recovered.")
    if recovery.unfinished:
        problems.append(f"{len(recovery.unfinished)} message(s) recovered from the killed "
                        f"worker never ran to their end: "
                        f"{', '.join(f'#{i}' for i in recovery.unfinished[:10])}.")
    return problems
