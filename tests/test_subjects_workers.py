"""Ordered subjects and concurrency limits with real worker processes: a ledger of every
run proves order per subject and the limit per key, under 2 processes x 4 threads with
random failures and a kill -9; a killed head runs again before anything after it; a
retrying head holds its subject; a dead head holds it until released, or is skipped."""

from __future__ import annotations

import random
import signal

import pytest

from django_mysqlq import broker
from django_mysqlq.broker import Operator
from django_mysqlq.models import Gate, Message
from tests.conftest import wait_for
from tests.subject_support import most_at_once, order_violations, runs, succeeded_seqs
from tests.testapp import gated
from tests.testapp.models import GateRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PATIENCE = 120.0
WORKER = ("--concurrency", "4", "--batch", "4")


def gated_left() -> int:
    return Message.objects.filter(gate_key__isnull=False).count()


def ok_runs(label: str) -> int:
    return GateRun.objects.filter(label=label, edge="end", outcome="ok").count()


def stop(*workers) -> None:
    for worker in workers:
        if worker.popen.poll() is None:
            # Not before its signal handlers are in place (a worker started just now).
            wait_for(lambda worker=worker: "started: queues=" in worker.output(), timeout=30,
                     message="the worker to start")
            worker.signal(signal.SIGTERM)
    for worker in workers:
        if worker.popen.poll() is None or worker.popen.returncode != -signal.SIGKILL:
            assert worker.wait(timeout=30) in (0, -signal.SIGKILL), worker.output()


def test_order_per_subject_and_limit_per_key_hold_through_failures_and_kill_9(start_worker):
    rng = random.Random(13)
    label = "ledger"
    ordered = [gated.ordered_step.call(f"o{s}", seq, label, rng.randint(0, 30), 0.15)
               for seq in range(8) for s in range(12)]
    limited = [gated.limited_step.call(f"l{k}", seq, label, rng.randint(10, 40), 0.15)
               for seq in range(8) for k in range(6)]
    gated.ordered_step.enqueue_many(ordered)
    gated.limited_step.enqueue_many(limited)
    first, second = start_worker(*WORKER), start_worker(*WORKER)
    wait_for(lambda: ok_runs(label) >= 40, timeout=PATIENCE, message="a third of the runs")
    first.signal(signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    third = start_worker(*WORKER)
    wait_for(lambda: gated_left() == 0, timeout=PATIENCE, interval=0.2,
             message="every ordered and limited message to finish")
    stop(second, third)

    ordered_keys = [f"o{s}" for s in range(12)]
    assert order_violations(label, killed=frozenset({first.pid}), keys=ordered_keys) == []
    peaks = most_at_once(label)
    assert all(peaks[key] == 1 for key in ordered_keys), peaks
    limited_peaks = [peaks[f"l{k}"] for k in range(6)]
    assert max(limited_peaks) <= gated.LIMIT, peaks
    done = succeeded_seqs(label)
    for key in ordered_keys:
        assert sorted(set(done[key])) == list(range(8))
        assert sorted(done[key]) == done[key]  # successes in enqueue order
    for k in range(6):
        assert sorted(set(done[f"l{k}"])) == list(range(8))
    # Failures happened, and so did runs cut short by the kill.
    all_runs = [run for found in runs(label).values() for run in found]
    assert any(run[3] == "failed" for run in all_runs)
    assert not Gate.objects.exists()
    assert not Message.objects.filter(status="dead").exists()


def test_a_concurrency_key_runs_up_to_its_limit_at_once_not_one_by_one(start_worker):
    """The limit is a limit, not a lock: with one key, slow tasks and threads to spare, two
    of its messages run side by side (the mixed ledger above may not show it when busy)."""
    label = "side-by-side"
    gated.limited_step.enqueue_many([gated.limited_step.call("k", seq, label, 400)
                                     for seq in range(6)])
    worker = start_worker(*WORKER)
    wait_for(lambda: gated_left() == 0, timeout=PATIENCE, interval=0.2,
             message="the key's messages to finish")
    stop(worker)
    assert most_at_once(label)["k"] == gated.LIMIT


def test_a_head_killed_with_its_worker_runs_again_before_the_rest(start_worker):
    label = "killed-head"
    head = gated.ordered_sleeps.enqueue("s", 1, label, 30).id
    for seq in (2, 3, 4):
        gated.ordered_step.enqueue("s", seq, label)
    worker = start_worker(*WORKER)
    wait_for(lambda: GateRun.objects.filter(label=label, seq=1).exists(), timeout=30,
             message="the head to start")
    wait_for(lambda: Message.objects.filter(pk=head, started_at__isnull=False).exists(),
             timeout=5, message="the head's start to be recorded")
    worker.signal(signal.SIGKILL)
    assert worker.wait(timeout=10) == -signal.SIGKILL
    Message.objects.filter(pk=head).update(payload='{"args":["s",1,"killed-head",0],'
                                                   '"kwargs":{}}')  # no 30 s sleep again
    peer = start_worker(*WORKER)
    wait_for(lambda: gated_left() == 0, timeout=60, message="the subject to drain")
    stop(peer)
    order = [(seq, outcome) for _, _, seq, outcome in runs(label)["s"]]
    assert order == [(1, "killed"), (1, "ok"), (2, "ok"), (3, "ok"), (4, "ok")]


def test_a_retrying_head_holds_its_subject_on_a_worker(start_worker):
    label = "retrying"
    gated.ordered_fails_first.enqueue("s", 1, label, 2)
    gated.ordered_step.enqueue("s", 2, label)
    gated.ordered_step.enqueue("t", 1, label)  # another subject runs meanwhile
    worker = start_worker(*WORKER)
    wait_for(lambda: gated_left() == 0, timeout=60, message="both subjects to drain")
    stop(worker)
    order = [(seq, outcome) for _, _, seq, outcome in runs(label)["s"]]
    assert order == [(1, "failed"), (1, "failed"), (1, "ok"), (2, "ok")]
    # The other subject did not wait for the retries (0.3 s, 0.6 s of backoff).
    assert runs(label)["t"][0][0] < runs(label)["s"][1][0]


def test_a_dead_head_holds_its_subject_until_an_operator_releases_it(start_worker):
    label = "dead-head"
    dead = gated.ordered_dies.enqueue("s", 1, label).id
    rest = [gated.ordered_step.enqueue("s", seq, label).id for seq in (2, 3)]
    worker = start_worker("--burst", *WORKER)
    # Nothing it can run is left; 3: a message went dead during the --burst run.
    assert worker.wait(timeout=60) == 3, worker.output()
    assert list(Message.objects.filter(pk__in=[dead, *rest]).order_by("pk")
                .values_list("status", flat=True)) == ["dead", "blocked", "blocked"]
    assert [h.id for h in broker.holders([broker.GateRef("default", True, "s")])[
        broker.GateRef("default", True, "s")]] == [dead]
    assert broker.release_subjects([rest[0]], Operator("cli:test")) == [dead]
    worker = start_worker("--burst", *WORKER)
    assert worker.wait(timeout=60) == 0, worker.output()
    assert [seq for _, _, seq, _ in runs(label)["s"]] == [1, 2, 3]
    assert Message.objects.get(pk=dead).status == "dead"


def test_on_dead_skip_lets_a_worker_go_on(start_worker):
    label = "skipping"
    gated.ordered_dies_skipping.enqueue("s", 1, label)
    gated.ordered_step.enqueue("s", 2, label)
    worker = start_worker("--burst", *WORKER)
    assert worker.wait(timeout=60) == 3, worker.output()  # 3: the head went dead
    assert [(seq, outcome) for _, _, seq, outcome in runs(label)["s"]] == [
        (1, "failed"), (2, "ok")]


def test_an_atomic_ordered_task_moves_its_subject_with_its_own_commit(start_worker):
    label = "atomic"
    for seq in range(5):
        gated.ordered_atomic.enqueue("s", seq, label)
    worker = start_worker("--burst", *WORKER)
    assert worker.wait(timeout=60) == 0, worker.output()
    assert [seq for _, _, seq, _ in runs(label)["s"]] == list(range(5))
    assert not Gate.objects.exists()


def test_subjects_keep_order_with_repeatable_read_producers_and_workers(start_worker):
    """The site at REPEATABLE READ: the worker's task connections (atomic tasks ack in the
    task's own transaction, with its older snapshot) and a producer enqueueing into the same
    subjects while they run (its transactions one after another, so seq is commit order;
    concurrent producers: tests/test_subjects_hostile.py)."""
    import threading

    from django.db import connection, transaction

    label = "rr"
    worker = start_worker(*WORKER, env={"MYSQLQ_TEST_ISOLATION": "repeatable read"})

    def produce() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for seq in range(40):
                with transaction.atomic():
                    for s in range(4):
                        gated.ordered_atomic.enqueue(f"s{s}", seq, label)
        finally:
            connection.close()

    producers = [threading.Thread(target=produce)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(60)
    wait_for(lambda: gated_left() == 0, timeout=PATIENCE, message="every subject to drain")
    stop(worker)
    assert order_violations(label) == []
    assert {key: sorted(seqs) for key, seqs in succeeded_seqs(label).items()} == {
        f"s{s}": list(range(40)) for s in range(4)}
    assert not Gate.objects.exists()
