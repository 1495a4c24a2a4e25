"""Producers of one dedup key at the same moment, just after that key's message finished.

The finished row stays in the key's unique index as a deleted entry until InnoDB purges
it; two transactions inserting the key then deadlocked on it (1213, one caller's whole
transaction rolled back: 8 to 12 of 60 pairs, with or without a long transaction holding
purge). Now they insert one at a time (``broker.dedup_lock``): one message, the other
producer gets its id."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction

from django_mysqlq.models import Message
from tests.conftest import raw_connection
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

PAIRS = 60


def _race(keys: list[str], isolation: str) -> list[list[Any]]:
    """For each key, two producers (threads that keep their connections, as a site's
    do) enqueue it at once, each in its own transaction at ``isolation``; what each got,
    per key."""
    barrier = threading.Barrier(2)
    results: list[list[Any]] = [[] for _ in keys]
    lock = threading.Lock()

    def produce() -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {isolation}")
            for index, key in enumerate(keys):
                barrier.wait()
                try:
                    with transaction.atomic():
                        handle = tasks.record.using(dedup_key=key).enqueue("again")
                        time.sleep(0.02)  # (the commit comes after the other's insert)
                    got: Any = handle.id
                except OperationalError as exc:
                    got = exc.args[0]
                with lock:
                    results[index].append(got)
                barrier.wait()  # (the main thread finishes the next key meanwhile)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=produce) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "REPEATABLE READ"])
@pytest.mark.parametrize("purge_held", [False, True], ids=["purge-running", "purge-held"])
def test_two_producers_of_a_just_finished_key_make_one_message(purge_held: bool,
                                                               isolation: str) -> None:
    stranger = raw_connection()
    if purge_held:  # a report or a dump: nothing finished is purged meanwhile
        stranger.cursor().execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    keys = [f"totals:{pair}" for pair in range(PAIRS)]
    try:
        for key in keys:  # each key's message finished just before its pair races
            finished = tasks.record.using(dedup_key=key).enqueue("first")
            Message.objects.filter(pk=finished.id).delete()  # as its ack does
        outcomes = _race(keys, isolation)
    finally:
        stranger.rollback()
        stranger.close()
    deadlocked = [o for o in outcomes if 1213 in o]
    assert not deadlocked, f"{len(deadlocked)} of {PAIRS} pairs deadlocked: {deadlocked}"
    for key, ids in zip(keys, outcomes, strict=True):
        [held] = Message.objects.filter(dedup_key=key).values_list("id", flat=True)
        assert ids == [held, held], (key, ids)


def test_a_transaction_enqueuing_its_key_again_waits_for_no_one_long() -> None:
    """A holds the key's new row and enqueues the key again while B's INSERT waits for
    that row under the key's lock: A must not wait on B (a cycle InnoDB can't see) longer
    than the lock's own bound, and both get A's message."""
    b_result: list[Any] = []
    b_waiting = threading.Event()

    def producer_b() -> None:
        try:
            b_waiting.set()
            b_result.append(tasks.record.using(dedup_key="twice").enqueue("b").id)
        finally:
            connections.close_all()

    with transaction.atomic():
        first = tasks.record.using(dedup_key="twice").enqueue("a")
        b = threading.Thread(target=producer_b)
        b.start()
        b_waiting.wait()
        time.sleep(0.3)  # B now holds the key's lock, its INSERT waiting for A's row
        started = time.monotonic()
        again = tasks.record.using(dedup_key="twice").enqueue("a again")
        waited = time.monotonic() - started
    b.join(30)
    assert again.id == first.id
    assert waited < 4.0, waited  # (LOCK_WAIT_SECONDS is 2; innodb_lock_wait_timeout 50)
    assert b_result == [first.id]
    assert Message.objects.filter(dedup_key="twice").count() == 1


@contextlib.contextmanager
def _at_repeatable_read() -> Iterator[None]:
    """This test's connection at REPEATABLE READ within the block; closed after it (a new
    connection starts at the site's level again)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield
    finally:
        connection.close()


def _in_another_session(work: Callable[[], None]) -> None:
    """Run ``work`` on a thread of its own (so on connections of its own), to its end."""

    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)


def test_a_repeatable_read_snapshot_older_than_the_holder_still_gets_its_handle() -> None:
    """The holder committed after this transaction's snapshot: the INSERT meets it (the
    unique key), the plain read of the holder does not see it, and three tries ended in
    a bare IntegrityError 1062 instead of the holder's handle."""
    holder: list[int] = []

    def other_producer() -> None:
        holder.append(tasks.record.using(dedup_key="rr-key").enqueue("first").id)

    with _at_repeatable_read():
        with transaction.atomic():
            assert Message.objects.count() == 0  # the snapshot is taken here
            _in_another_session(other_producer)
            again = tasks.record.using(dedup_key="rr-key").enqueue("second")
        assert holder and again.id == holder[0]
        assert Message.objects.filter(dedup_key="rr-key").count() == 1


@pytest.mark.parametrize("end", ["acked", "dead"])
def test_a_repeatable_read_snapshot_older_than_a_new_holder_gets_the_new_one(end) -> None:
    """The snapshot still shows the key's old message A (since acked, or dead: its key
    given up); another session then enqueued B with the key. The INSERT meets B, and the
    plain read of the holder found A in the snapshot: the caller got A's handle, a
    finished message, while B, the one that will run, was never named."""
    from django.utils import timezone

    from django_mysqlq import broker
    from django_mysqlq.messages import AttemptResult, Runner

    old = tasks.record.using(dedup_key="rr-moved").enqueue("A").id
    new: list[int] = []

    def finish_then_enqueue() -> None:
        [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
        result = AttemptResult(started_at=timezone.now(), error_class="E")
        runner = Runner("rr-test", "h", 1, "t")
        if end == "acked":
            broker.ack_many([(claimed, runner, result)])
        else:
            broker.fail(claimed, runner, result, retry=False)
        new.append(tasks.record.using(dedup_key="rr-moved").enqueue("B").id)

    with _at_repeatable_read():
        with transaction.atomic():
            assert Message.objects.filter(dedup_key="rr-moved").get().pk == old  # snapshot
            _in_another_session(finish_then_enqueue)
            assert new and new[0] != old
            again = tasks.record.using(dedup_key="rr-moved").enqueue("C")
        assert again.id == new[0]
        assert list(Message.objects.filter(dedup_key="rr-moved").values_list(
            "pk", flat=True)) == [new[0]]


def test_a_deadlock_of_producers_of_one_key_is_retried_in_autocommit_only(monkeypatch) -> None:
    """Behind a proxy no named lock serializes the producers of a key, and InnoDB may pick
    one of two racing inserts as a deadlock victim. In autocommit that transaction was
    the broker's own, yet the 1213 reached the caller; inside the caller's transaction it
    must (everything there was rolled back)."""
    import importlib

    broker_enqueue = importlib.import_module("django_mysqlq.broker.enqueue")
    real = broker_enqueue._insert_keyed
    calls: list[int] = []

    def victim_once(alias: str, message: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError(1213, "Deadlock found when trying to get lock; try "
                                         "restarting transaction")
        return real(alias, message)

    monkeypatch.setattr(broker_enqueue, "_insert_keyed", victim_once)
    handle = tasks.record.using(dedup_key="deadlocked").enqueue("x")
    assert Message.objects.filter(id=handle.id, dedup_key="deadlocked").exists()
    calls.clear()
    with pytest.raises(OperationalError), transaction.atomic():
        tasks.record.using(dedup_key="deadlocked-in-atomic").enqueue("y")
    assert not Message.objects.filter(dedup_key="deadlocked-in-atomic").exists()
