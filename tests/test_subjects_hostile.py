"""Ordered subjects against concurrent producers, another isolation level, a gate row locked
by a stranger, and gate counters changed by hand."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
from django.db import OperationalError, connection, connections, transaction

from django_mysqlq import broker
from django_mysqlq.models import Gate, Message
from tests.subject_support import RUNNER, ack, claim, gate, ok, set_gate, status
from tests.testapp import tasks
from tests.testapp.gated import ordered_step

pytestmark = pytest.mark.django_db(transaction=True)

#: A stranger's lock on one gate row (by its unique key: it locks that row alone).
HOLD_GATE_SQL = ("SELECT id FROM mysqlq_gate WHERE queue = 'default' AND ordered = 1 "
                 "AND gate_key = 'held' FOR UPDATE")


def enqueue(key: str, *seqs: int) -> list[int]:
    return [ordered_step.enqueue(key, seq, "t").id for seq in seqs]


def drain_in_claim_order() -> list[tuple[str, int, int]]:
    """Claim and ack one at a time; the (key, seq, id) of each message in the order run."""
    order = []
    while claimed := claim(limit=1):
        [message] = claimed
        if message.gate_key is not None:
            key, seq, _ = json.loads(message.payload)["args"]
            order.append((key, seq, message.id))
        ack(claimed)
    return order


def test_a_second_producer_of_a_subject_waits_for_the_first_to_commit():
    first_in = threading.Event()
    returned: dict[str, float] = {}
    ids: dict[str, int] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                ids["first"] = ordered_step.enqueue("s", 1, "t").id
                first_in.set()
                time.sleep(0.6)
            returned["first_commit"] = time.monotonic()
        finally:
            connection.close()

    def second() -> None:
        try:
            first_in.wait(5)
            with transaction.atomic():
                tasks.record.enqueue("unrelated")  # an id taken before the subject's
                ids["second"] = ordered_step.enqueue("s", 2, "t").id
                returned["second_enqueue"] = time.monotonic()
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    # The second waited on the gate row until the first committed: ids follow commits.
    assert returned["second_enqueue"] >= returned["first_commit"] - 0.01
    assert ids["first"] < ids["second"]
    assert status(ids["first"], ids["second"]) == ["ready", "blocked"]
    assert [seq for _, seq, _ in drain_in_claim_order()] == [1, 2]


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "REPEATABLE READ"])
def test_concurrent_producers_keep_commit_order_per_subject(isolation):
    """Four producers, overlapping transactions into the same subjects (and new ones, two
    subjects per transaction in sorted order), some rolled back: whenever one commit of a
    subject's message ended before another began, it runs first."""
    committed: list[tuple[float, float, str, int]] = []  # commit began, ended, key, seq
    errors: list[str] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        rng = random.Random(n)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {isolation}")
            for step in range(40):
                keys = sorted(rng.sample(["a", "b", "c", f"own{n}-{step}"], 2))
                seqs = [n * 1000 + step * 10 + i for i in range(len(keys))]
                try:
                    with transaction.atomic():
                        for key, seq in zip(keys, seqs, strict=True):
                            ordered_step.enqueue(key, seq, "t")
                        time.sleep(rng.uniform(0, 0.01))
                        if rng.random() < 0.1:
                            raise RuntimeError("rolled back")
                        began = time.monotonic()
                    ended = time.monotonic()
                    with lock:
                        committed.extend((began, ended, key, seq)
                                         for key, seq in zip(keys, seqs, strict=True))
                except RuntimeError:
                    pass
                except OperationalError as exc:
                    errors.append(str(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    ran = drain_in_claim_order()
    assert errors == []  # sorted subjects per transaction: producers never deadlock
    assert sorted((key, seq) for key, seq, _ in ran) == sorted((k, s) for _, _, k, s in committed)
    position = {(key, seq): index for index, (key, seq, _) in enumerate(ran)}
    checked = 0
    for key in ("a", "b", "c"):
        ids = [i for k, _, i in ran if k == key]
        assert ids == sorted(ids)
        mine = [c for c in committed if c[2] == key]
        for first in mine:
            for second in mine:
                if first[1] < second[0]:  # first's commit was over before second's began
                    checked += 1
                    assert position[(key, first[3])] < position[(key, second[3])]
    assert checked > 100
    assert Gate.objects.count() == 0


def test_producers_of_two_subjects_in_opposite_orders_can_deadlock_like_any_two_rows():
    """Documented, not hidden: separate enqueue() calls into two subjects lock their gates
    in call order; enqueue_many() sorts them (docs/ordering.md)."""
    barrier = threading.Barrier(2, timeout=5)
    outcome: list[str] = []

    def produce(keys: tuple[str, str]) -> None:
        try:
            with transaction.atomic():
                ordered_step.enqueue(keys[0], 1, "t")
                barrier.wait()
                ordered_step.enqueue(keys[1], 2, "t")
            outcome.append("committed")
        except OperationalError as exc:
            outcome.append(str(exc.args[0]))
        finally:
            connection.close()

    threads = [threading.Thread(target=produce, args=(keys,))
               for keys in (("x", "y"), ("y", "x"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcome) == ["1213", "committed"]
    before = Message.objects.count()
    with transaction.atomic():
        ordered_step.enqueue_many([ordered_step.call(k, 3, "t") for k in ("y", "x")])
    assert Message.objects.count() == before + 2


def test_an_ack_steps_over_a_gate_a_stranger_holds():
    locked_head, after = enqueue("held", 1, 2)
    free_head, free_after = enqueue("free", 1, 2)
    claimed = {m.id: m for m in claim()}
    stranger = connections.create_connection("default")
    try:
        with stranger.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            cursor.execute(HOLD_GATE_SQL)
        busy: list = []
        started = time.monotonic()
        owned = broker.ack_many([(m, RUNNER, ok()) for m in claimed.values()], busy=busy)
        assert time.monotonic() - started < 1.0  # no lock wait
        assert owned == {free_head}
        assert [finished[0].id for finished in busy] == [locked_head]
        assert status(locked_head, after, free_after) == ["claimed", "blocked", "ready"]
        with stranger.cursor() as cursor:
            cursor.execute("ROLLBACK")
        assert broker.ack_many(busy) == {locked_head}
        assert status(after) == ["ready"]
    finally:
        stranger.close()


def test_an_ack_without_a_busy_list_waits_for_the_gate():
    head, after = enqueue("held", 1, 2)
    [message] = claim()
    stranger = connections.create_connection("default")
    try:
        with stranger.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            cursor.execute(HOLD_GATE_SQL)
        stranger.inc_thread_sharing()  # the timer's thread ends the stranger's transaction
        timer = threading.Timer(0.5, lambda: stranger.cursor().execute("ROLLBACK"))
        timer.start()
        assert broker.ack_many([(message, RUNNER, ok())]) == {head}
        timer.join()
        assert status(after) == ["ready"]
    finally:
        stranger.close()


def test_a_gate_counter_set_too_high_by_hand_is_repaired():
    _, after = enqueue("s", 1, 2)
    ack(claim())
    assert status(after) == ["ready"]
    ack(claim())
    enqueue("s", 3, 4)  # 3 ready, 4 blocked
    set_gate("s", active=7)  # as if 7 held it: 4 would wait for ever
    ack(claim())
    assert gate("s") == (6, 1)
    waiting = Message.objects.get(status="blocked").id
    repairs = broker.repair_gates(stale_seconds=0)
    # (was, should be): nothing held it, one waited; the repair promotes that one.
    assert [(r.active, r.blocked) for r in repairs] == [((6, 0), (1, 1))]
    assert status(waiting) == ["ready"]
    assert gate("s") == (1, 0)
    assert broker.repair_gates(stale_seconds=0) == []  # right now: nothing to repair


def test_a_negative_gate_counter_breaks_nothing_and_is_repaired():
    first, _ = enqueue("s", 1, 2)
    set_gate("s", active=-5, blocked=-3)
    third = enqueue("s", 3)[0]  # no out-of-range arithmetic, and no slot while unsure
    assert status(first, third) == ["ready", "blocked"]
    assert [(r.active, r.blocked) for r in broker.repair_gates(stale_seconds=0)] == [
        ((0, 1), (1, 2))]
    assert gate("s") == (1, 2)
    assert [seq for _, seq, _ in drain_in_claim_order()] == [1, 2, 3]


def test_a_gate_row_deleted_by_hand_comes_back():
    _, after = enqueue("s", 1, 2)
    Gate.objects.all().delete()
    ack(claim())  # the ack makes the gate again and moves the subject on
    assert status(after) == ["ready"]
    Gate.objects.all().delete()
    enqueue("s", 3)  # a new gate: 3 gets a slot beside 2 (the order is lost once) ...
    Message.objects.filter(pk__gt=after).update(status="blocked")
    Gate.objects.all().delete()
    broker.repair_gates(stale_seconds=0)  # ... but blocked ones whose gate is gone move on
    assert gate("s") == (1, 1)


def test_an_atomic_tasks_ack_sees_what_committed_after_its_snapshot():
    """ack_within runs in the task's transaction: at REPEATABLE READ its snapshot may be
    older than a blocked message committed since; the successor must still move."""
    head = enqueue("s", 1)[0]
    [message] = claim()
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        with transaction.atomic():
            Message.objects.count()  # the snapshot is taken here
            other = threading.Thread(target=lambda: (enqueue("s", 2), connection.close()))
            other.start()
            other.join(10)
            assert broker.ack_within(message, RUNNER, ok())
        [after] = Message.objects.values_list("status", flat=True)
        assert after == "ready"
        assert status(head) == [None]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
