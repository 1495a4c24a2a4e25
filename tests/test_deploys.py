"""Rolling deploys: a worker that doesn't know a message's task gives it back for later.

During a deploy an old worker can claim a message of a task only the new release has.
Sending it dead at once destroyed it; it is deferred instead (its attempt not counted),
a bounded number of times (``MYSQLQ['UNKNOWN_TASK_RETRIES']``), and only then dead.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_mysqlq.models import Attempt, Message
from tests.burst import assert_succeeded, run_burst
from tests.conftest import wait_for
from tests.testapp import next_release
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

NEXT_RELEASE = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.next_release"}


def test_an_old_worker_defers_a_task_it_does_not_know(start_worker):
    handle = next_release.new_in_this_release.enqueue("new")
    counts, output = run_burst(start_worker)  # an "old" worker: the module isn't imported
    message = Message.objects.get(pk=handle.id)
    assert message.status == "scheduled"
    assert (message.attempts, message.deferrals) == (0, 1)  # its one attempt is kept
    assert message.run_at > timezone.now() + dt.timedelta(seconds=2)
    assert "No task named" in message.last_error
    [attempt] = Attempt.objects.for_message(handle.id)
    assert attempt.outcome == "deferred"
    assert counts["deferred"] == 1 and counts["dead"] == 0
    assert "gave it back to run in 5s (deferral 1 of 12)" in output


def test_a_worker_of_the_new_release_then_runs_it(start_worker):
    handle = next_release.new_in_this_release.enqueue("new")
    run_burst(start_worker)
    Message.objects.filter(pk=handle.id).update(run_at=timezone.now())  # due now
    new_worker = start_worker("--burst", env=NEXT_RELEASE)
    assert new_worker.wait(timeout=20) == 0, new_worker.output()
    assert list(Ledger.objects.values_list("label", flat=True)) == ["new"]
    outcomes = list(Attempt.objects.for_message(handle.id).values_list("outcome", flat=True))
    assert outcomes == ["deferred", "succeeded"]  # max_attempts=1, still ran once


def test_a_task_nobody_knows_goes_dead_after_its_deferrals(start_worker):
    handle = next_release.new_in_this_release.enqueue("never")
    Message.objects.filter(pk=handle.id).update(deferrals=12)
    counts, output = run_burst(start_worker)
    message = Message.objects.get(pk=handle.id)
    assert message.status == "dead"
    assert "No task named" in message.last_error
    [attempt] = Attempt.objects.for_message(handle.id)
    assert attempt.outcome == "failed"
    assert attempt.payload == message.payload  # kept for a replay once the task exists
    assert counts["dead"] == 1
    assert "given back 12 times already" in output


def test_deferring_never_holds_up_the_known_tasks(start_worker):
    from tests.testapp import tasks

    before = tasks.record.enqueue("before").id
    unknown = [next_release.new_in_this_release.enqueue(f"u{i}").id for i in range(3)]
    after = tasks.record.enqueue("after").id
    run_burst(start_worker, "--concurrency", "2")
    assert_succeeded(before, after)
    wait_for(lambda: Message.objects.filter(pk__in=unknown, status="scheduled").count() == 3,
             timeout=5, message="the unknown tasks' messages to wait for a later try")
