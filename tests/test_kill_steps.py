"""kill -9 at each step of a task message's life, with the worker's transaction open.

A worker stops dead right after one statement (tests/stall_at.py) and is killed there
with kill -9: after its claim, after marking its tasks started, inside its ack, inside a
retry, inside a dead-lettering, and (as recovery leader) inside the recovery of a dead
peer's claim. A new worker must then finish everything: every task ran to its end, none
lost, a second run only where the killed process ran it first, the failing tasks retried
to success or dead after their attempts, nothing else left in the queue.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from django_mysqlq.models import Message
from tests.conftest import wait_for
from tests.kill_support import PATIENCE, WORKER, kill_when_stalled, stalling_worker
from tests.test_topics_workers import started
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

RECORDS = 30
#: The statement after which the worker stops, by step.
STEPS = {
    "claim": r"SET status = 'claimed', claim_token",
    "start": r"SET m\.started_at = o\.started_at",
    "ack": r"^\s*DELETE m FROM .* mysqlq_message",
    "retry": r"SET status = IF\(%s > 0, 'scheduled'",
    "dead": r"SET status = 'dead', run_at = UTC_TIMESTAMP\(6\), last_error",
    "recover": r"SET status = IF\(started_at IS NOT NULL AND attempts >= max_attempts",
}


def enqueue_work(label: str) -> tuple[list[int], list[int]]:
    """Plain records, tasks that fail once then succeed, tasks that always fail, and two
    that run long enough for their start to be recorded (about once a second)."""
    for n in range(2):
        tasks.slow.enqueue(f"{label}:slow{n}", 1.5)
    for value in range(RECORDS):
        tasks.record.enqueue(label, value)
    flaky = [tasks.fails_until.enqueue(f"{label}:flaky{n}", 2).id for n in range(4)]
    doomed = [tasks.always_fails.enqueue(f"{label}:dead{n}").id for n in range(2)]
    return flaky, doomed


@pytest.mark.parametrize("step", list(STEPS))
def test_a_worker_killed_inside_a_step_loses_nothing(start_worker, tmp_path: Path,
                                                     step: str) -> None:
    label = f"kill-at-{step}"
    marker = tmp_path / "stalled"
    if step == "recover":
        # A peer dies holding a running task; the stalling worker, the only one left and
        # so the recovery leader, stops inside that claim's recovery.
        peer = start_worker(*WORKER)
        started(peer)
        tasks.slow.enqueue(f"{label}:orphan", 2.0)
        wait_for(lambda: Ledger.objects.filter(label=f"{label}:orphan:start").exists(),
                 timeout=PATIENCE, message="the peer to start the slow task")
        peer.signal(signal.SIGKILL)
        assert peer.wait(timeout=10) == -signal.SIGKILL
    doomed = stalling_worker(start_worker, STEPS[step], marker)
    started(doomed)
    flaky, dead = enqueue_work(label)
    kill_when_stalled(doomed, marker, step)
    survivor = start_worker(*WORKER)
    started(survivor)

    def finished() -> bool:
        done = set(Ledger.objects.filter(label=label).values_list("value", flat=True))
        return (done == set(range(RECORDS))
                and Ledger.objects.filter(label__in=[f"{label}:slow{n}:end" for n in range(2)]
                                          ).values("label").distinct().count() == 2
                and all(m.status == "dead" for m in Message.objects.filter(id__in=dead))
                and not Message.objects.exclude(status="dead").exists())

    try:
        wait_for(finished, timeout=PATIENCE, message="every message to be finished")
    except BaseException:
        print(marker.read_text(), survivor.output()[-3000:])
        print(list(Message.objects.values_list("id", "task_name", "status", "attempts")))
        raise
    runs = Counter(Ledger.objects.filter(label=label).values_list("value", flat=True))
    for value, count in runs.items():
        if count > 1:
            pids = set(Ledger.objects.filter(label=label, value=value)
                       .values_list("pid", flat=True))
            assert doomed.pid in pids, f"record {value} ran {count} times, none killed"
    assert not Message.objects.filter(id__in=flaky).exists()  # succeeded: acked, gone
    for n in range(2):  # each dead one ran its 3 attempts, once more only if killed
        pids = list(Ledger.objects.filter(label=f"{label}:dead{n}").values_list("pid",
                                                                                flat=True))
        assert len(pids) == 3 or (len(pids) == 4 and doomed.pid in pids), pids
    if step == "recover":
        assert Ledger.objects.filter(label=f"{label}:orphan:end").exists()
