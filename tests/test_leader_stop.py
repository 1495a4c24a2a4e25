"""A recovery leader that stops gives the lead up at once, not when its drain ends.

Real ``runqueueworker`` processes, real SIGTERM. The leader kept its ``GET_LOCK`` for its
whole graceful drain (up to ``GRACE_SECONDS``, minutes in production), waiting for a long
task: meanwhile no peer could sweep, and a crashed worker's messages stayed claimed. Now
the follower leads, and recovers them, while the old leader still drains.

Timeouts are liveness bounds, not performance figures.
"""

from __future__ import annotations

import importlib
import signal
import threading
import time

import pytest
from django.db import connection, connections

from django_mysqlq import broker
from django_mysqlq.broker.base import RECOVERY_LOCK_NAME
from django_mysqlq.models import Message, Worker
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

#: The leader's task and grace period: far longer than the test waits for the follower.
NAP = 90
GRACE = 120
PATIENCE = 30.0


def lock_holder() -> int | None:
    """The connection holding the recovery lock, if any."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT IS_USED_LOCK({RECOVERY_LOCK_NAME})")
        value = cursor.fetchone()[0]
    return None if value is None else int(value)


def claim_and_die(message_id: int) -> None:
    """A worker that claimed ``message_id`` and died (its connection is gone)."""
    def run() -> None:
        try:
            [claimed] = broker.claim(["elsewhere"], 1, "crashed-peer", lease_seconds=300)
            assert claimed.id == message_id
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def test_a_stopping_leader_hands_recovery_to_a_follower_before_its_drain_ends(start_worker):
    env = {"MYSQLQ_TEST_GRACE": str(GRACE)}
    leader = start_worker("--concurrency", "1", env=env, label="-leader")
    old_holder = wait_for(lock_holder, timeout=PATIENCE, message="the first worker to lead")
    tasks.naps.enqueue("long", NAP)
    wait_for(lambda: Ledger.objects.filter(label="long:start").exists(), timeout=PATIENCE,
             message="the leader to start its long task")
    follower = start_worker("--concurrency", "1", env=env, label="-follower")
    wait_for(lambda: Worker.objects.filter(pid=follower.pid, stopped_at=None).exists(),
             timeout=PATIENCE, message="the follower to start")
    assert lock_holder() == old_holder

    leader.signal(signal.SIGTERM)
    wait_for(lambda: "Waiting up to" in leader.output(), timeout=PATIENCE,
             message="the leader to drain")
    lost = tasks.record.using(queue="elsewhere").enqueue("lost").id  # a queue nobody serves
    claim_and_die(lost)
    wait_for(lambda: Message.objects.filter(pk=lost, status="ready").exists(),
             timeout=PATIENCE, message="the crashed peer's claim to be recovered")
    assert leader.popen.poll() is None, "recovered only once the leader was gone"
    assert lock_holder() not in (None, old_holder)
    assert "gave up the recovery lead" in leader.output()
    assert "Recovered 1 message(s)" in follower.output()


def test_resigning_a_clusters_lease_ends_it_at_once():
    """On a Galera cluster the lead is the lease row: resigning ends it (a peer takes it at
    its next try, not ``LEASE_SECONDS`` later)."""
    leader = importlib.import_module("django_mysqlq.broker.leader")
    assert leader._take_lease("default", 300)
    # What take(keep=True) marks on a cluster: the lease's end, by this process's clock.
    setattr(connection.connection, leader._LEADER_ATTRIBUTE, time.monotonic() + 300)
    assert broker.is_recovery_leader()
    assert broker.resign_recovery_lead() is True
    assert not broker.is_recovery_leader()
    with connection.cursor() as cursor:
        cursor.execute("SELECT expires_at <= UTC_TIMESTAMP(6) FROM mysqlq_lease "
                       "WHERE name = 'recover'")
        assert cursor.fetchone()[0] == 1
    assert broker.resign_recovery_lead() is False  # nothing left to give up
