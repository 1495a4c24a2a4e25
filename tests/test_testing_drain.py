"""django_mysqlq.testing.drain(): the real queue, run in the test's process through the
worker's own claim, executor and ack/retry/dead statements."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_mysqlq import QueueError, UnknownTask, broker
from django_mysqlq.messages import NewMessage
from django_mysqlq.models import Attempt, Message
from django_mysqlq.signals import task_finished, task_started
from django_mysqlq.testing import DrainResult, drain
from tests.testapp import testing_tasks as tt
from tests.testapp.models import Ledger


def outcomes(result: DrainResult) -> list[tuple[str, int, str]]:
    return [(item.task_name.rsplit(".", 1)[-1], item.attempt, item.outcome)
            for item in result.outcomes]


@pytest.mark.django_db(transaction=True)
def test_drain_runs_committed_messages_through_the_real_path():
    seen = []

    def started(sender, message_id, attempt, **kwargs):
        seen.append(("started", message_id, attempt))

    task_started.connect(started)
    try:
        handle = tt.echo.enqueue("a", 1)
        tt.echo.using(priority=10).enqueue("b")
        result = drain()
    finally:
        task_started.disconnect(started)
    assert (result.processed, result.succeeded, result.failed, result.dead) == (2, 2, 0, 0)
    # Priority first, as a worker claims; then FIFO.
    assert list(Ledger.objects.order_by("id").values_list("label", flat=True)) == ["b", "a"]
    assert not Message.objects.exists()
    state = handle.state()  # read back from the history table
    assert state.status == "succeeded" and state.result["items"] == [1]
    row = Attempt.objects.get(message_id=handle.id)
    assert row.outcome == "succeeded" and row.worker_id.startswith("drain:")
    assert [event[0] for event in seen] == ["started", "started"]
    assert drain().processed == 0


@pytest.mark.django_db(transaction=True)
def test_a_failure_is_raised_after_the_drain_with_its_summary():
    tt.breaks.using(priority=5).enqueue("x")
    tt.echo.enqueue("after")
    with pytest.raises(ValueError, match="broken x") as caught:
        drain()
    # Its retries (retry_backoff=0: due at once, priority 5) ran first, then the rest.
    assert caught.value.__notes__ == [
        "django_mysqlq.testing.drain(): 4 attempt(s): 1 succeeded, 2 retried, 1 dead; pass "
        "raise_errors=False to get the result instead."]
    assert Ledger.objects.filter(label="after").exists()
    message = Message.objects.get()
    assert (message.status, message.attempts) == ("dead", 3)


@pytest.mark.django_db(transaction=True)
def test_retries_run_within_the_drain_until_the_message_is_dead():
    handle = tt.breaks.enqueue("r")
    result = drain(raise_errors=False)
    assert outcomes(result) == [("breaks", 1, "retried"), ("breaks", 2, "retried"),
                                ("breaks", 3, "failed")]
    assert (result.failed, result.retried, result.dead) == (3, 2, 1)
    assert [str(error) for error in result.errors] == ["broken r"] * 3
    assert handle.status == "dead"
    assert list(Attempt.objects.filter(message_id=handle.id)
                .values_list("outcome", flat=True)) == ["retried", "retried", "failed"]


@pytest.mark.django_db(transaction=True)
def test_a_flaky_task_succeeds_on_its_retry():
    handle = tt.breaks_until.enqueue("f", 2)
    result = drain(raise_errors=False)
    assert outcomes(result) == [("breaks_until", 1, "retried"),
                                ("breaks_until", 2, "succeeded")]
    assert handle.state().result == "finally"


@pytest.mark.django_db(transaction=True)
def test_wait_seconds_waits_for_a_retry_that_is_not_due_yet():
    handle = tt.breaks_until.enqueue("w", 2)
    Message.objects.filter(pk=handle.id).update(retry_backoff=0.3)
    assert drain(raise_errors=False).processed == 1  # the retry is 0.2-0.4 s away
    assert Message.objects.get(pk=handle.id).status == "scheduled"
    result = drain(wait_seconds=5)
    assert outcomes(result) == [("breaks_until", 2, "succeeded")]


@pytest.mark.django_db(transaction=True)
def test_queues_max_messages_and_paused_queues():
    tt.echo.enqueue("d1")
    tt.echo.enqueue("d2")
    tt.elsewhere.enqueue("e1")
    assert outcomes(drain(["elsewhere"])) == [("elsewhere", 1, "succeeded")]
    assert drain(max_messages=1).processed == 1
    broker.set_paused("default", True, broker.Operator("test"))
    assert drain().processed == 0
    broker.set_paused("default", False, broker.Operator("test"))
    assert drain().processed == 1


@pytest.mark.django_db(transaction=True)
def test_a_queue_name_given_as_a_string_is_refused():
    # drain("elsewhere") would take it as the queues 'e', 'l', 's', ... and run nothing.
    tt.elsewhere.enqueue("s1")
    for wrong in ("elsewhere", b"elsewhere"):
        with pytest.raises(TypeError, match=r"a list of queue names.*\['elsewhere'\]"):
            drain(wrong)
    assert Message.objects.count() == 1
    assert outcomes(drain(("elsewhere",))) == [("elsewhere", 1, "succeeded")]


@pytest.mark.django_db(transaction=True)
def test_messages_enqueued_by_the_tasks_run_in_the_same_drain():
    tt.chain.enqueue("c", 2)
    assert drain().succeeded == 3
    assert sorted(Ledger.objects.values_list("label", flat=True)) == ["c:0", "c:1", "c:2"]


@pytest.mark.django_db(transaction=True)
def test_a_message_this_process_cannot_run_is_an_error_too(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "UNKNOWN_TASK_RETRIES": 0}
    [message_id] = broker.enqueue([NewMessage(
        task_name="tests.gone.task", queue="default", priority=0, payload='{"args": []}',
        run_at=None, delay=0.0, max_attempts=1, retry_backoff=0.0, timeout=None,
        dedup_key=None)])
    with pytest.raises(QueueError, match=f"Message #{message_id} .* could not run and is "
                                         "dead: .*No task named 'tests.gone.task'"):
        drain()
    settings.MYSQLQ = {**settings.MYSQLQ, "UNKNOWN_TASK_RETRIES": 3}
    broker.enqueue([NewMessage(
        task_name="tests.gone.other", queue="default", priority=0, payload='{"args": []}',
        run_at=None, delay=0.0, max_attempts=1, retry_backoff=0.0, timeout=None,
        dedup_key=None)])
    result = drain(raise_errors=False)
    assert outcomes(result) == [("other", 1, "deferred")]
    assert isinstance(result.errors[0], UnknownTask)


@pytest.mark.django_db(transaction=True)
def test_finished_receivers_see_the_drain_as_a_worker():
    seen = []

    def finished(sender, outcome, error, **kwargs):
        seen.append((outcome, type(error).__name__))

    task_finished.connect(finished)
    try:
        tt.echo.enqueue("s")
        drain()
    finally:
        task_finished.disconnect(finished)
    assert seen == [("succeeded", "NoneType")]


@pytest.mark.django_db(transaction=True)
def test_not_inside_your_own_transaction():
    tt.echo.enqueue("t")
    with transaction.atomic(), pytest.raises(RuntimeError, match="autocommit"):
        drain()


@pytest.mark.django_db(transaction=True)
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_queue_database_that_is_not_mysql_is_refused(settings):
    settings.DATABASES = {**settings.DATABASES,
                          "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    settings.MYSQLQ = {**settings.MYSQLQ, "DATABASE": "lite"}
    with pytest.raises(QueueError, match=r"MYSQLQ\['IMMEDIATE'\]"):
        drain()


# ----------------------------------------------------------------- inside a TestCase


@pytest.mark.django_db  # the test's own transaction: nothing here is ever committed
def test_inside_a_testcase_the_uncommitted_messages_are_drained():
    handle = tt.echo.enqueue("tc", 7)
    tt.breaks.enqueue("tc-broken")
    result = drain(raise_errors=False)
    assert (result.succeeded, result.dead) == (1, 1)
    assert handle.state().result["items"] == [7]
    assert Ledger.objects.filter(label="tc").count() == 1
    assert Ledger.objects.filter(label="tc-broken").count() == 3
    assert Message.objects.get().status == "dead"


@pytest.mark.django_db
def test_inside_a_testcase_an_atomic_task_rolls_back_only_its_own_writes():
    Ledger.objects.create(label="before", pid=0)
    tt.writes_then_breaks.enqueue("atomic")
    result = drain(raise_errors=False, wait_seconds=10)  # its retries are 0.1 s apart
    assert (result.retried, result.dead) == (2, 1)
    assert list(Ledger.objects.values_list("label", flat=True)) == ["before"]
