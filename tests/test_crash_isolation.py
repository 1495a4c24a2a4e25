"""One crash hurts one message, and a claim recovered by a peer never starts here too.

A task that kills its process took every message claimed with it down: each lost an
attempt it never started and died as ``WorkerLost``. Only a message that started spends
its attempt now; unstarted ones get theirs back, and a message lost with its worker once
runs alone in its process from then on, so a repeat offender can only take itself down.

A worker whose claims a peer recovered (its connection was killed, its lease ran out)
must notice before it starts the rest of the batch: the peer runs them.

Real worker processes, real ``os._exit`` and ``KILL CONNECTION``. Timeouts are liveness
bounds, never performance assertions.
"""

from __future__ import annotations

import collections
import signal
import threading

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_mysqlq import broker
from django_mysqlq.models import Attempt, Message
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def outcomes(message_id: int) -> list[str]:
    return list(Attempt.objects.for_message(message_id).values_list("outcome", flat=True))


@pytest.mark.worker
def test_a_task_that_kills_its_process_costs_its_neighbours_nothing(start_worker):
    killer = tasks.exits_process.enqueue("killer").id
    neighbours = [tasks.record_once.enqueue(f"n{i}").id for i in range(9)]
    worker = start_worker("--processes", "1", "--concurrency", "2", "--batch", "10")
    wait_for(lambda: list(Message.objects.values_list("pk", "status")) == [(killer, "dead")],
             timeout=60, message="the killer to go dead and every neighbour to succeed")
    # Each neighbour ran once, on its first attempt: nothing of the crashes was charged
    # to it (with max_attempts=1 one charge would have made it dead).
    for message_id in neighbours:
        history = list(Attempt.objects.for_message(message_id))
        assert history[-1].outcome == "succeeded", [a.outcome for a in history]
        assert history[-1].attempt == 1
        assert {a.outcome for a in history[:-1]} <= {"lost"}
        assert all("had not started" in a.error_message for a in history[:-1])
    # A neighbour that finished beside the killer before the first crash, unacked, ran
    # again (at-least-once); none more than that.
    runs = collections.Counter(Ledger.objects.exclude(label="killer:start")
                               .values_list("label", flat=True))
    assert set(runs) == {f"n{i}" for i in range(9)}
    assert max(runs.values()) <= 2
    # The killer spent its two attempts on its own crashes only, alone each time.
    killer_history = list(Attempt.objects.for_message(killer))
    assert killer_history[-1].outcome == "failed"
    assert [a.attempt for a in killer_history if "had not started" not in a.error_message] \
        == [1, 2]
    assert Message.objects.get(pk=killer).losses >= 2
    assert "killed by" in worker.output() or "exited with status 1" in worker.output()


def test_recovery_gives_back_the_attempt_of_a_message_that_had_not_started():
    started, waiting = tasks.record.enqueue_many([["started"], ["waiting"]])
    box: dict = {}

    def peer():  # claims both, records one start, then its connection closes: it "died"
        claimed = broker.claim(["default"], 10, "peer", lease_seconds=30)
        first = next(m for m in claimed if m.id == started.id)
        box["marked"] = broker.mark_started([(first, timezone.now())])
        connections.close_all()

    thread = threading.Thread(target=peer)
    thread.start()
    thread.join()
    assert box["marked"] == 1
    wait_for(lambda: broker.recover(), timeout=5, message="a recovery")
    rows = {m.pk: m for m in Message.objects.all()}
    assert (rows[started.id].attempts, rows[started.id].losses) == (1, 1)
    assert (rows[waiting.id].attempts, rows[waiting.id].losses) == (0, 1)
    assert rows[started.id].started_at is None and rows[waiting.id].started_at is None
    [lost_started] = Attempt.objects.for_message(started.id)
    [lost_waiting] = Attempt.objects.for_message(waiting.id)
    assert "had not started" not in lost_started.error_message
    assert "had not started" in lost_waiting.error_message
    # Claimed again, each comes back with its loss: it will run alone.
    again = broker.claim(["default"], 10, "w", lease_seconds=30)
    assert {m.id: (m.attempt, m.losses) for m in again} == {started.id: (2, 1),
                                                           waiting.id: (1, 1)}


def test_a_lost_message_on_its_last_attempt_dies_only_if_it_had_started():
    started, waiting = tasks.record_once.enqueue_many([["s"], ["w"]])

    def peer():
        claimed = broker.claim(["default"], 10, "peer", lease_seconds=30)
        broker.mark_started([(m, timezone.now()) for m in claimed if m.id == started.id])
        connections.close_all()

    thread = threading.Thread(target=peer)
    thread.start()
    thread.join()
    recovered = wait_for(lambda: broker.recover(), timeout=5, message="a recovery")
    # The sweep says which it buried: the worker that ran it counts them in its `dead`.
    assert sorted(recovered) == sorted([started.id, waiting.id])
    assert recovered.dead == [started.id]
    assert Message.objects.get(pk=started.id).status == "dead"
    assert Message.objects.get(pk=waiting.id).status == "ready"
    assert outcomes(started.id) == ["failed"]
    assert outcomes(waiting.id) == ["lost"]


@pytest.mark.worker
def test_a_worker_whose_connection_is_killed_does_not_run_the_recovered_rest(start_worker):
    labels = [f"s{i}" for i in range(10)]
    ids = [tasks.slow.enqueue(label, 0.3).id for label in labels]
    # The default heartbeat (5 s) is longer than a peer's sweep interval: the peer
    # recovers the claims before the next heartbeat could re-stamp them.
    slow_beat = {"MYSQLQ_TEST_HEARTBEAT": "5"}
    first = start_worker("--concurrency", "1", "--batch", "10", env=slow_beat)
    wait_for(lambda: Message.objects.filter(status="claimed").count() == 10, timeout=15,
             message="the first worker to claim the whole batch")
    wait_for(lambda: Ledger.objects.filter(label="s0:start").exists(), timeout=15,
             message="the first message to start")
    owner = Message.objects.filter(status="claimed").values_list("owner_connection",
                                                                 flat=True).first()
    second = start_worker("--concurrency", "1", env=slow_beat)  # recovers and runs them
    wait_for(lambda: second.output().count("started:") >= 1 or "started" in second.output(),
             timeout=15, message="the second worker to start")
    with connection.cursor() as cursor:
        cursor.execute("KILL CONNECTION %s", [owner])
    wait_for(lambda: not Message.objects.filter(pk__in=ids).exists(), timeout=40,
             message="every message to finish")
    starts = collections.Counter(
        label.removesuffix(":start")
        for label in Ledger.objects.filter(label__endswith=":start").values_list("label",
                                                                                 flat=True))
    assert set(starts) == set(labels)
    twice = sorted(label for label, count in starts.items() if count > 1)
    # At most what was running (or starting) in the moment the connection died; before,
    # the whole recovered batch ran a second time.
    assert len(twice) <= 2, (twice, first.output()[-2000:])


@pytest.mark.worker
def test_a_worker_paused_past_its_lease_does_not_run_the_recovered_rest(start_worker):
    """SIGSTOP past the lease: a peer takes the claims; after SIGCONT, nothing more of them
    starts here (the claims are checked again first: the last check is stale)."""
    short_lease = {"MYSQLQ_TEST_LEASE": "3", "MYSQLQ_TEST_HEARTBEAT": "1"}
    leader = start_worker("--queues", "other", env=short_lease)  # sweeps; runs none of them
    wait_for(lambda: "started" in leader.output(), timeout=15, message="the sweeper to start")
    labels = [f"p{i}" for i in range(10)]
    ids = [tasks.slow.enqueue(label, 0.3).id for label in labels]
    paused = start_worker("--concurrency", "1", "--batch", "10", env=short_lease)
    wait_for(lambda: Message.objects.filter(status="claimed").count() == 10, timeout=15,
             message="the worker to claim the whole batch")
    wait_for(lambda: Ledger.objects.filter(label="p0:start").exists(), timeout=15,
             message="the first message to start")
    paused.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: Attempt.objects.filter(message_id__in=ids, outcome="lost").count()
                 >= 9, timeout=20, message="the sweeper to recover the paused claims")
    finally:
        paused.signal(signal.SIGCONT)
    start_worker("--concurrency", "2", env=short_lease)  # runs what was recovered
    wait_for(lambda: not Message.objects.filter(pk__in=ids).exists(), timeout=40,
             message="every message to finish")
    starts = collections.Counter(
        label.removesuffix(":start")
        for label in Ledger.objects.filter(label__endswith=":start").values_list("label",
                                                                                 flat=True))
    twice = sorted(label for label, count in starts.items() if count > 1)
    assert twice in ([], ["p0"]), (twice, paused.output()[-2000:])
