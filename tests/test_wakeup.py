"""Idle workers park in SQL and are woken by producers with KILL QUERY."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import transaction

from django_mysqlq import broker
from django_mysqlq.broker import park
from django_mysqlq.models import Attempt, Worker
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

#: Every periodic duty 30 s apart: only a wake-up can make a parked worker act sooner.
SLOW_UPKEEP = {"MYSQLQ_TEST_HEARTBEAT": "30", "MYSQLQ_TEST_LEASE": "90",
               "MYSQLQ_TEST_RECOVERY": "30"}


def parked(worker) -> bool:
    return Worker.objects.filter(pid=worker.pid, listening=True).exists()


def test_a_parked_worker_is_woken_by_a_commit(start_worker):
    worker = start_worker(env=SLOW_UPKEEP)
    wait_for(lambda: parked(worker), 15, message="the worker to park")
    time.sleep(1)  # its park has grown well past a second by now
    with transaction.atomic():
        handle = tasks.record.enqueue("wake")
        time.sleep(0.3)
        assert Attempt.objects.count() == 0  # not before the commit
    wait_for(lambda: Attempt.objects.filter(message_id=handle.id).exists(), 10,
             message="the woken worker to run the message")
    wait_for(lambda: parked(worker), 15, message="the worker to park again")


def test_a_parked_worker_sleeps_until_the_next_delayed_message_is_due(start_worker):
    worker = start_worker(env=SLOW_UPKEEP)
    wait_for(lambda: parked(worker), 15, message="the worker to park")
    handle = tasks.record.using(delay=1.5).enqueue("due")
    wait_for(lambda: Attempt.objects.filter(message_id=handle.id).exists(), 10,
             message="the due message to run")
    attempt = Attempt.objects.get(message_id=handle.id)
    assert attempt.started_at >= attempt.enqueued_at + dt.timedelta(seconds=1.5)


def test_wakeup_off_polls_and_never_parks(start_worker):
    worker = start_worker(env={"MYSQLQ_TEST_WAKEUP": "0"})
    wait_for(lambda: Worker.objects.filter(pid=worker.pid).exists(), 15, message="register")
    handle = tasks.record.enqueue("polled")
    wait_for(lambda: Attempt.objects.filter(message_id=handle.id).exists(), 10,
             message="the polling worker to run the message")
    assert not Worker.objects.filter(pid=worker.pid, listening=True).exists()


def test_wake_skips_dead_listeners_and_reports_woken_ones():
    broker.register_worker("ghost", "h", 1, ["default"], 1)
    Worker.objects.filter(pk="ghost").update(listening=True, connection_id=2**31)
    assert broker.wake(["default"]) == 0  # unknown thread id: ignored
    assert not park._wake_state.disabled


def test_wake_passes_over_its_own_connection():
    """A member that says it listens and then pumps (so wakes its own group's queue) must
    not KILL QUERY its own connection: that ended the KILL itself with error 1317, and
    wake() took it for a missing privilege and turned every later wake-up of the process
    off."""
    own = broker.connection_session().connection_id
    broker.register_worker("me", "h", 1, ["default"], 1)
    Worker.objects.filter(pk="me").update(listening=True, connection_id=own)
    park._wake_state.quiet_since.clear()
    try:
        assert broker.wake(["default"]) == 1  # counted: it claims next anyway
        assert not park._wake_state.disabled
    finally:
        park._wake_state.disabled.clear()


def test_a_worker_parks_while_a_plain_success_waits_for_its_ack(start_worker):
    """An ack waiting in the acker's batch doesn't keep the worker awake polling (only a
    gated one does, for the gate's next message): the next producer's wake-up reaches it."""
    worker = start_worker("--batch", "10",
                          env={**SLOW_UPKEEP, "MYSQLQ_TEST_ACK_DELAY": "8"})
    wait_for(lambda: parked(worker), 15, message="the worker to park")
    handle = tasks.record.enqueue("first")
    wait_for(lambda: Ledger.objects.filter(label="first").exists(), 10,
             message="the first message to run")
    # Its ack waits up to 8 s for company; meanwhile the worker is parked again.
    wait_for(lambda: parked(worker), 5, message="the worker to park with an ack pending")
    assert not Attempt.objects.filter(message_id=handle.id).exists()
    second = tasks.record.enqueue("second")
    wait_for(lambda: Ledger.objects.filter(label="second").exists(), 5,
             message="the woken worker to run the second message")
    wait_for(lambda: Attempt.objects.filter(message_id__in=[handle.id, second.id]).count() == 2,
             15, message="both acks")
