"""Real worker subprocesses running real messages to their end."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
from django.db import transaction

from django_mysqlq.models import Attempt, Message, Worker
from tests.burst import expected_status
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker,
              pytest.mark.compat]


def run_burst(start_worker, *args: str) -> str:
    worker = start_worker("--burst", "--json-summary", *args)
    status = worker.wait(timeout=60)
    output = worker.output()
    assert status == expected_status(summary(output)["dead"], args), output
    return output


def summary(output: str) -> dict:
    line = next(line for line in reversed(output.splitlines()) if line.startswith("{"))
    return json.loads(line)


def test_enqueued_tasks_are_processed_and_traced(start_worker):
    handles = tasks.record.enqueue_many(
        [tasks.record.call(f"m{i}", value=i) for i in range(20)])
    output = run_burst(start_worker, "--concurrency", "3", "--batch", "5")
    assert summary(output)["succeeded"] == 20
    assert not Message.objects.exists()
    assert sorted(Ledger.objects.values_list("value", flat=True)) == list(range(20))
    attempt = Attempt.objects.get(message_id=handles[7].id)
    assert attempt.outcome == "succeeded"
    assert attempt.result == 7
    assert attempt.attempt == 1
    assert attempt.pid == Ledger.objects.get(value=7).pid != os.getpid()
    assert attempt.host and attempt.connection_id and attempt.thread.startswith("mysqlq-task-")
    assert attempt.started_at <= attempt.finished_at
    assert attempt.enqueued_at <= attempt.started_at
    worker = Worker.objects.get(pid=attempt.pid)
    assert worker.id == attempt.worker_id
    assert worker.stopped_at is not None and worker.processed == 20
    assert handles[7].state().status == "succeeded"


def test_a_failing_task_is_retried_then_dead_with_every_attempt_recorded(start_worker):
    handle = tasks.always_fails.enqueue("f")
    output = run_burst(start_worker)
    counts = summary(output)
    assert (counts["retried"], counts["dead"], counts["succeeded"]) == (2, 1, 0)
    message = Message.objects.get(pk=handle.id)
    assert message.status == "dead"
    assert message.attempts == 3
    assert message.last_error == "builtins.ValueError: boom f"
    attempts = list(Attempt.objects.for_message(handle.id))
    assert [a.outcome for a in attempts] == ["retried", "retried", "failed"]
    assert [a.attempt for a in attempts] == [1, 2, 3]
    assert all("ValueError: boom f" in a.traceback for a in attempts)
    assert Ledger.objects.filter(label="f").count() == 3
    # Backoff: the second attempt started no sooner than the base delay after the first.
    gap = (attempts[1].started_at - attempts[0].finished_at).total_seconds()
    assert gap >= 0.1 * 0.75
    assert handle.status == "dead"


def test_a_task_that_succeeds_on_retry_ends_succeeded(start_worker):
    handle = tasks.fails_until.enqueue("u", succeed_on=2)
    run_burst(start_worker)
    outcomes = list(Attempt.objects.for_message(handle.id).values_list("outcome", flat=True))
    assert outcomes == ["retried", "succeeded"]
    assert not Message.objects.filter(pk=handle.id).exists()


def test_delayed_messages_run_no_earlier_than_asked(start_worker):
    delayed = tasks.record.using(delay=1.5).enqueue("delayed")
    at = tasks.record.using(run_at=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).enqueue(
        "at")
    asked = {delayed.id: 1.5, at.id: 1.0}
    row_times = {m.pk: m.run_at for m in Message.objects.all()}
    run_burst(start_worker)
    for message_id, delay in asked.items():
        attempt = Attempt.objects.get(message_id=message_id)
        assert attempt.outcome == "succeeded"
        assert attempt.started_at >= row_times[message_id]
        assert attempt.started_at >= attempt.enqueued_at + dt.timedelta(seconds=delay) - \
            dt.timedelta(milliseconds=50)


def test_higher_priority_runs_first_then_fifo(start_worker):
    labels = [("low1", -5), ("mid1", 0), ("high1", 50), ("mid2", 0), ("high2", 50),
              ("low2", -5), ("top", 100)]
    for label, priority in labels:
        tasks.record.using(priority=priority).enqueue(label)
    run_burst(start_worker, "--concurrency", "1", "--batch", "1")
    order = list(Ledger.objects.order_by("id").values_list("label", flat=True))
    assert order == ["top", "high1", "high2", "mid1", "mid2", "low1", "low2"]


def test_queues_are_served_in_the_order_listed(start_worker):
    tasks.record.enqueue_many([["d1"], ["d2"]])
    tasks.on_other_queue.enqueue("o1")
    run_burst(start_worker, "--queues", "other,default", "--concurrency", "1", "--batch", "1")
    assert list(Ledger.objects.order_by("id").values_list("label", flat=True)) == [
        "o1", "d1", "d2"]


def test_a_worker_ignores_queues_it_was_not_given(start_worker):
    tasks.on_other_queue.enqueue("o1")
    tasks.record.enqueue("d1")
    run_burst(start_worker, "--queues", "default")
    assert list(Ledger.objects.values_list("label", flat=True)) == ["d1"]
    assert Message.objects.get().queue == "other"


def test_a_rolled_back_enqueue_never_runs(start_worker):
    with transaction.atomic():
        tasks.record.enqueue("rolled-back")
        transaction.set_rollback(True)
    with transaction.atomic():
        tasks.record.enqueue("committed")
    run_burst(start_worker)
    assert list(Ledger.objects.values_list("label", flat=True)) == ["committed"]
    assert Attempt.objects.count() == 1


def test_a_corrupt_payload_dies_alone(start_worker):
    """No retry can fix it. (An unknown task is deferred instead: tests/test_deploys.py.)"""
    good_before = tasks.record.enqueue("before")
    corrupt = tasks.record.enqueue("y")
    wrong_shape = tasks.record.enqueue("z")
    good_after = tasks.record.enqueue("after")
    Message.objects.filter(pk=corrupt.id).update(payload='{"args": [')
    Message.objects.filter(pk=wrong_shape.id).update(payload='["not", "an", "object"]')
    output = run_burst(start_worker)
    assert summary(output)["succeeded"] == 2
    assert sorted(Ledger.objects.values_list("label", flat=True)) == ["after", "before"]
    dead = {m.pk: m for m in Message.objects.dead()}
    assert set(dead) == {corrupt.id, wrong_shape.id}
    assert "not valid JSON" in dead[corrupt.id].last_error
    assert "must be a JSON object" in dead[wrong_shape.id].last_error
    for message_id in dead:
        [attempt] = Attempt.objects.for_message(message_id)
        assert attempt.outcome == "failed"  # no retries: nothing could fix it
    assert {good_before.id, good_after.id}.isdisjoint(dead)


def test_async_task_functions_run(start_worker):
    handle = tasks.async_record.enqueue("from-async")
    run_burst(start_worker)
    assert Attempt.objects.get(message_id=handle.id).result == "from-async"
    assert Ledger.objects.filter(label="from-async").exists()


def test_an_async_task_under_a_plain_decorator_runs_and_is_awaited(start_worker):
    """Its wrapper is sync and returns the coroutine: called as a plain function, the
    body never ran and the attempt counted as a success."""
    handle = tasks.wrapped_async_record.enqueue("wrapped")
    run_burst(start_worker)
    assert Ledger.objects.filter(label="wrapped").exists()
    assert Attempt.objects.get(message_id=handle.id).result == "wrapped"


def test_async_tasks_use_their_task_thread_for_database_calls(start_worker):
    """Not one thread and connection shared by every async task of the process."""
    handles = tasks.async_records_its_db_thread.enqueue_many([["a1"], ["a2"], ["a3"]])
    run_burst(start_worker, "--concurrency", "2")
    threads = {Attempt.objects.get(message_id=h.id).result for h in handles}
    assert threads and all(name.startswith("mysqlq-task-") for name in threads), threads


def test_a_task_that_closes_the_connection_does_not_hurt_the_worker(start_worker):
    tasks.closes_connection.enqueue_many([["c1"], ["c2"], ["c3"]])
    tasks.record.enqueue("after")
    output = run_burst(start_worker, "--concurrency", "1")
    assert summary(output)["succeeded"] == 4
    assert Ledger.objects.count() == 4


def test_a_task_past_its_timeout_is_reported(start_worker):
    # One process can't cut a thread off: the task runs to its end, and its attempt
    # gets its line and its count like any other (--processes: test_burst_exit.py).
    handle = tasks.overruns.enqueue("late")
    output = run_burst(start_worker)
    assert "past its timeout" in output
    assert Ledger.objects.filter(label="late").exists()
    assert (f"task=tests.testapp.tasks.overruns id={handle.id} queue=default attempt=1/3 "
            "outcome=succeeded duration_ms=") in output
    assert summary(output)["succeeded"] == 1


def test_max_tasks_stops_after_that_many_claims(start_worker):
    tasks.record.enqueue_many([[f"m{i}"] for i in range(6)])
    worker = start_worker("--max-tasks", "4", "--batch", "10", "--concurrency", "2")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert Attempt.objects.succeeded().count() == 4
    assert Message.objects.ready().count() == 2


@pytest.mark.parametrize("ack_batch", ["1", "7"])
def test_acks_one_by_one_or_in_batches_record_every_success(start_worker, worker_env, ack_batch):
    handles = tasks.record.enqueue_many([[f"m{i}"] for i in range(30)])
    worker = start_worker("--burst", "--concurrency", "4",
                          env={"MYSQLQ_TEST_ACK_BATCH": ack_batch})
    assert worker.wait(timeout=60) == 0, worker.output()
    assert not Message.objects.exists()
    assert set(Attempt.objects.succeeded().values_list("message_id", flat=True)) == {
        h.id for h in handles}
