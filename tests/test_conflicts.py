"""``retry_on_conflict``: your transaction, run again whole when it loses a deadlock.

On a Galera cluster the same error comes from a certification conflict at COMMIT; that
case is in tests/test_galera.py. Here, on one server, a real deadlock: two transactions
lock two rows in opposite orders.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from django_mysqlq.conflicts import retry_on_conflict
from django_mysqlq.models import Message
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_deadlocked_transaction_is_run_again_and_both_commit_once():
    first = Ledger.objects.create(label="a", value=0, pid=0)
    second = Ledger.objects.create(label="b", value=0, pid=0)
    both_locked_one = threading.Barrier(2, timeout=10)
    runs = {"ab": 0, "ba": 0}

    def locker(name: str, order: list[int]) -> None:
        @retry_on_conflict()
        def work() -> None:
            runs[name] += 1
            Ledger.objects.filter(pk=order[0]).update(value=1)
            if runs[name] == 1:
                both_locked_one.wait()  # each holds its first row: the second lock deadlocks
            Ledger.objects.filter(pk=order[1]).update(value=1)
            tasks.record.enqueue(name)

        try:
            work()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=locker, args=("ab", [first.pk, second.pk])),
               threading.Thread(target=locker, args=("ba", [second.pk, first.pk]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(runs.values()) == [1, 2]  # InnoDB chose one victim; it ran again
    labels = sorted(Message.objects.values_list("payload", flat=True))
    assert labels == ['{"args":["ab"],"kwargs":{}}', '{"args":["ba"],"kwargs":{}}']


def test_inside_an_open_transaction_it_refuses_and_says_why():
    @retry_on_conflict()
    def work() -> None:
        tasks.record.enqueue("x")

    with transaction.atomic(), pytest.raises(RuntimeError, match="outside any atomic"):
        work()


def test_other_errors_are_raised_at_once():
    runs = []

    @retry_on_conflict()
    def work() -> None:
        runs.append(1)
        raise ValueError("not a conflict")

    with pytest.raises(ValueError, match="not a conflict"):
        work()
    assert runs == [1]


@pytest.mark.parametrize("attempts", [0, -1, 1.5, True, "3"])
def test_a_bad_attempts_value_is_refused(attempts):
    with pytest.raises(ValueError, match="attempts"):
        retry_on_conflict(attempts=attempts)
