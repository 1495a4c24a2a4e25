"""A recovery wakes parked workers: the messages it gives back are ready at once, and no
producer's enqueue will wake anyone for them.

Before, an idle worker saw a recovered message only when its park ended (up to
``HEARTBEAT_SECONDS``, 5 s by default); on a Galera cluster, where a crashed worker's claims
already wait out their lease, that doubled the kill-to-re-run time of the chaos run.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from django_mysqlq import broker
from django_mysqlq.models import Worker
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: Longer than the test: a park that returns did so because it was woken.
PARK_SECONDS = 60


def parked_asleep(worker_id: str) -> bool:
    ids = list(Worker.objects.filter(pk=worker_id, listening=True)
               .values_list("connection_id", flat=True))
    if not ids:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                       "WHERE STATE = 'User sleep' AND ID = %s", ids)
        return int(cursor.fetchone()[0]) == 1


def test_a_recovery_wakes_a_worker_parked_on_the_recovered_message_s_queue():
    handle = tasks.record.enqueue("lost")

    def peer() -> None:  # claims with a lease that runs out, then goes away
        broker.claim(["default"], 1, "peer", 0.2)
        connections.close_all()

    claimer = threading.Thread(target=peer)
    claimer.start()
    claimer.join(10)
    results: list[str] = []

    def park() -> None:
        try:
            broker.register_worker("parked", "h", 1, ["default"], 1)
            broker.listen("parked", True)
            results.append(broker.idle_wait(["default"], PARK_SECONDS)[0])
        finally:
            connections.close_all()

    parked = threading.Thread(target=park)
    parked.start()
    try:
        wait_for(lambda: parked_asleep("parked"), 15, message="the worker asleep in its park")
        assert wait_for(lambda: broker.recover(liveness="lease"), 10,
                        message="the claim recovered") == [handle.id]
        parked.join(10)
        assert results and results[0] in ("woken", "interrupted")
    finally:
        if parked.is_alive():  # not woken: end its park so the test can finish
            with connection.cursor() as cursor:
                cursor.execute("SELECT connection_id FROM mysqlq_worker WHERE id = 'parked'")
                cursor.execute("KILL QUERY %s", [cursor.fetchone()[0]])
            parked.join(10)
