"""Pausing a queue: a running worker stops claiming from it within seconds; messages stay."""

from __future__ import annotations

import time

import pytest

from django_mysqlq import broker
from django_mysqlq.models import Message
from tests.conftest import wait_for
from tests.operator_support import OPERATOR
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_a_paused_queue_is_left_alone_and_resumes(start_worker):
    worker = start_worker("--queues", "default,other", "--concurrency", "2")
    wait_for(lambda: "started" in worker.output(), message="the worker to start")
    broker.set_paused("default", True, OPERATOR)
    wait_for(lambda: "paused: default" in worker.output(), timeout=10,
             message="the worker to notice the pause")

    paused = tasks.record.enqueue_many([["p1"], ["p2"], ["p3"]])
    other = tasks.on_other_queue.enqueue("o1")
    # The other queue still runs: once its message is done, the paused ones had their chance.
    wait_for(lambda: Ledger.objects.filter(label="o1").exists(), message="the other queue")
    time.sleep(1.0)  # a few claim rounds of the worker, which must all skip 'default'
    assert not Ledger.objects.filter(label__startswith="p").exists()
    assert set(Message.objects.values_list("pk", "status")) == {(h.id, "ready") for h in paused}
    assert not Message.objects.filter(pk=other.id).exists()

    broker.set_paused("default", False, OPERATOR)
    wait_for(lambda: Ledger.objects.filter(label__startswith="p").count() == 3, timeout=10,
             message="the resumed queue to run")
    # Acks are batched: the last ones commit a moment after the tasks return.
    wait_for(lambda: not Message.objects.exists(), timeout=10, message="the acks")


def test_a_burst_worker_leaves_a_paused_queue_for_later(start_worker):
    broker.set_paused("default", True, OPERATOR)
    handle = tasks.record.enqueue("later")
    worker = start_worker("--burst")
    assert worker.wait(timeout=30) == 0, worker.output()
    assert Message.objects.get(pk=handle.id).status == "ready"
