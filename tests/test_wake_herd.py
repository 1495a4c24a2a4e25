"""Wake-ups without herding: an enqueue wakes as many parked workers as it has new messages,
plus one, never every listener; a pause or resume still wakes them all.

Parked workers are real connections in ``broker.idle_wait`` (threads), and the kills are
counted exactly: ``Com_kill`` of the producing session, and the parks that came back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections

from django_mysqlq import broker
from django_mysqlq.models import Attempt, Message, Worker
from tests.conftest import wait_for
from tests.operator_support import OPERATOR
from tests.test_wakeup import SLOW_UPKEEP
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PARKED = 6
#: What a killed park returns: MariaDB 10.11 reports the KILL during SLEEP() as an
#: interrupted statement (1317) rather than SLEEP() returning 1.
ENDED = {"woken", "interrupted"}
#: Longer than any test here: a park that returns did so because it was killed.
PARK_SECONDS = 60


class Parked:
    """``count`` connections parked on a queue like idle workers, and what their parks said."""

    def __init__(self, count: int, queue: str) -> None:
        self.results: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._park, args=(f"herd-{i}", queue))
                         for i in range(count)]

    def _park(self, worker_id: str, queue: str) -> None:
        try:
            broker.register_worker(worker_id, "herd", 1, [queue], 1)
            broker.listen(worker_id, True)
            state, _ = broker.idle_wait([queue], PARK_SECONDS)
            with self._lock:
                self.results.append(state)
        finally:
            connections.close_all()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        wait_for(self._all_asleep, 15, message="every listener to sleep in its park")

    def _all_asleep(self) -> bool:
        ids = list(Worker.objects.filter(listening=True).values_list("connection_id",
                                                                     flat=True))
        if len(ids) < len(self._threads):
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                           f"WHERE STATE = 'User sleep' AND ID IN ({', '.join(['%s'] * len(ids))})",
                           ids)
            return int(cursor.fetchone()[0]) == len(ids)

    def returned(self) -> list[str]:
        with self._lock:
            return list(self.results)

    def stop(self) -> None:
        """End the parks nobody woke."""
        ids = Worker.objects.filter(pk__startswith="herd-").values_list("connection_id",
                                                                         flat=True)
        with connection.cursor() as cursor:
            for connection_id in ids:
                try:
                    cursor.execute("KILL QUERY %s", [connection_id])
                except Exception:  # noqa: BLE001 - that park is over already
                    pass
        for thread in self._threads:
            thread.join(10)


@contextmanager
def parked(count: int = PARKED, queue: str = "default") -> Iterator[Parked]:
    listeners = Parked(count, queue)
    try:
        listeners.start()
        yield listeners
    finally:
        listeners.stop()


def kills_sent() -> int:
    """KILL statements this (the producing) session has sent so far."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Com_kill'")
        return int(cursor.fetchone()[1])


def woken_by(action: object, listeners: Parked) -> tuple[int, list[str]]:
    """Run ``action`` (it commits); return the kills it sent and the parks they ended."""
    before = kills_sent()
    action()  # type: ignore[operator]
    kills = kills_sent() - before
    wait_for(lambda: len(listeners.returned()) >= kills, 10,
             message=f"the {kills} killed park(s) to return")
    return kills, listeners.returned()


def test_one_message_wakes_at_most_two_of_six_parked_workers():
    with parked() as listeners:
        kills, returned = woken_by(lambda: tasks.record.enqueue("one"), listeners)
        # One woken worker claims the message; one spare. Before: 6 kills per message.
        assert 1 <= kills <= 2
        assert len(returned) == kills and set(returned) <= ENDED


def test_a_bulk_enqueue_of_three_wakes_at_most_four():
    with parked() as listeners:
        kills, returned = woken_by(
            lambda: tasks.record.enqueue_many([["a"], ["b"], ["c"]]), listeners)
        assert 1 <= kills <= 4
        assert len(returned) == kills and set(returned) <= ENDED


def test_a_requeue_of_one_message_wakes_at_most_two():
    tasks.record.enqueue("again")  # nobody listens yet: no kill
    message = Message.objects.get()
    Message.objects.filter(pk=message.pk).update(status="dead")
    with parked() as listeners:
        kills, returned = woken_by(lambda: broker.requeue([message.pk], OPERATOR), listeners)
        assert 1 <= kills <= 2
        assert len(returned) == kills and set(returned) <= ENDED


def test_pause_and_resume_still_wake_every_parked_worker():
    with parked() as listeners:
        kills, returned = woken_by(
            lambda: broker.set_paused("default", True, OPERATOR), listeners)
        assert kills == PARKED
        assert len(returned) == PARKED and set(returned) <= ENDED
    with parked() as listeners:
        kills, _ = woken_by(lambda: broker.set_paused("default", False, OPERATOR), listeners)
        assert kills == PARKED


def test_the_woken_workers_are_not_always_the_same():
    """Three parked, one message: two are woken, picked at random each time."""
    picked: set[frozenset[str]] = set()
    for _ in range(12):  # the same pair twelve times running: odds of 1 in 177,147
        with parked(3) as listeners:
            by_connection = dict(Worker.objects.filter(pk__startswith="herd-")
                                 .values_list("connection_id", "pk"))
            kills, _ = woken_by(lambda: tasks.record.enqueue("x"), listeners)
            assert kills == 2
            asleep = _sleeping(list(by_connection))
            picked.add(frozenset(worker for connection_id, worker in by_connection.items()
                                 if connection_id not in asleep))
        Message.objects.all().delete()
        Worker.objects.all().delete()
        if len(picked) > 1:
            return
    pytest.fail(f"the same listeners were woken every time: {picked}")


def _sleeping(ids: list[int]) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT ID FROM information_schema.PROCESSLIST "
                       f"WHERE STATE = 'User sleep' AND ID IN ({', '.join(['%s'] * len(ids))})",
                       ids)
        return {int(row[0]) for row in cursor.fetchall()}


def test_real_parked_workers_still_start_a_message_at_once(start_worker):
    """Three idle runqueueworker processes, one message: two kills, and it runs at once
    (every other duty is 30 s away, so only a wake-up can start it in time)."""
    workers = [start_worker(env=SLOW_UPKEEP) for _ in range(3)]
    wait_for(lambda: Worker.objects.filter(pid__in=[w.pid for w in workers],
                                           listening=True).count() == 3,
             30, message="three workers to park")
    before = kills_sent()
    handle = tasks.record.enqueue("prompt")
    assert kills_sent() - before <= 2
    wait_for(lambda: Attempt.objects.filter(message_id=handle.id).exists(), 10,
             message="a woken worker to run the message")
