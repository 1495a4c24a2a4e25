"""The test mode, MYSQLQ['IMMEDIATE']: enqueued tasks run in this process after the commit.

Run against the suite's MariaDB, asserting that no queue table is touched; the same mode
on SQLite and PostgreSQL projects is tests/test_non_mysql.py.
"""

from __future__ import annotations

import logging

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_mysqlq import (
    ArgumentEncodingError,
    MessageDoesNotExist,
    PayloadTooLarge,
    TaskArgumentError,
)
from django_mysqlq.immediate import ImmediateHandle
from django_mysqlq.models import Attempt, Message
from django_mysqlq.signals import message_enqueued, task_finished, task_started
from django_mysqlq.testing import immediate
from tests.testapp import testing_tasks as tt
from tests.testapp.models import Ledger


@pytest.fixture
def on(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE": True}


@pytest.fixture
def quiet(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE": True, "IMMEDIATE_RAISE": False}


@pytest.fixture
def events():
    seen: list[tuple] = []

    def enqueued(sender, message_ids, **kwargs):
        seen.append(("enqueued", sender, tuple(message_ids)))

    def started(sender, message_id, attempt, **kwargs):
        seen.append(("started", sender.name, message_id, attempt))

    def finished(sender, message_id, attempt, outcome, error, **kwargs):
        seen.append(("finished", sender.name, message_id, attempt, outcome, type(error)))

    pairs = [(message_enqueued, enqueued), (task_started, started), (task_finished, finished)]
    for signal, receiver in pairs:
        signal.connect(receiver)
    yield seen
    for signal, receiver in pairs:
        signal.disconnect(receiver)


def no_queue_statement(queries) -> bool:
    return not any("mysqlq_" in query["sql"] for query in queries)


@pytest.mark.django_db(transaction=True)
def test_autocommit_runs_at_once_with_the_workers_signals_and_no_queue_table(on, events):
    with CaptureQueriesContext(connection) as queries:
        handle = tt.echo.enqueue("a", (1, 2), 3, flag={"k": (4,)})
    assert isinstance(handle, ImmediateHandle)
    state = handle.state()
    assert (state.status, state.attempts, state.last_error) == ("succeeded", 1, "")
    assert state.is_finished and state.finished_at is not None
    # The payload's JSON round trip: the tuple arrived as a list, as on a worker.
    assert state.result == {"items": [[1, 2], 3], "types": ["list", "int"],
                            "flag": {"k": [4]}}
    assert handle.status == "succeeded"
    assert async_to_sync(handle.astate)() == state
    name = "tests.testapp.testing_tasks.echo"
    assert events == [("enqueued", name, (handle.id,)), ("started", name, handle.id, 1),
                      ("finished", name, handle.id, 1, "succeeded", type(None))]
    assert Ledger.objects.filter(label="a").count() == 1
    assert no_queue_statement(queries.captured_queries), queries.captured_queries
    assert not Message.objects.exists() and not Attempt.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_transaction_runs_it_after_commit_and_a_rollback_never(on, events):
    with transaction.atomic():
        handle = tt.echo.enqueue("later")
        assert handle.status == "ready" and not Ledger.objects.exists()
    assert handle.status == "succeeded" and Ledger.objects.filter(label="later").exists()

    with transaction.atomic():
        dropped = tt.echo.enqueue("never")
        transaction.set_rollback(True)
    with pytest.raises(MessageDoesNotExist, match="rolled back"):
        dropped.state()
    assert not Ledger.objects.filter(label="never").exists()
    assert [event[0] for event in events] == ["enqueued", "started", "finished"]


@pytest.mark.django_db(transaction=True)
def test_a_tasks_exception_raises_in_the_caller_by_default(on, events):
    with pytest.raises(ValueError, match="broken b"):
        tt.breaks.enqueue("b")
    # Once: retrying would only hide the failure (max_attempts is 3).
    assert Ledger.objects.filter(label="b").count() == 1
    assert events[-1][4:] == ("failed", ValueError)

    with pytest.raises(ValueError, match="broken c"):  # at the commit, out of atomic()
        with transaction.atomic():
            tt.breaks.enqueue("c")
            assert not Ledger.objects.filter(label="c").exists()
    assert Ledger.objects.filter(label="c").count() == 1  # the commit itself happened


@pytest.mark.django_db(transaction=True)
def test_immediate_raise_false_keeps_the_error_in_the_state_and_the_log(quiet, caplog):
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        handle = tt.breaks.enqueue("q")
    state = handle.state()
    assert (state.status, state.attempts, state.result) == ("dead", 1, None)
    assert state.last_error == "builtins.ValueError: broken q" and state.is_finished
    assert "failed (immediate mode, not retried), now dead" in caplog.text
    assert "ValueError: broken q" in caplog.text  # with its traceback


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_runs_every_message_then_raises_the_first_error(on, events):
    with pytest.raises(ValueError, match="broken m1"):
        tt.breaks.enqueue_many([("m1",), ("m2",)])
    assert Ledger.objects.filter(label__in=["m1", "m2"]).count() == 2
    enqueued = [event for event in events if event[0] == "enqueued"]
    assert len(enqueued) == 1 and len(enqueued[0][2]) == 2


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_with_calls(on):
    handles = tt.echo.enqueue_many([tt.echo.call("x", 1), ("y", 2, 3)])
    assert [h.state().result["items"] for h in handles] == [[1], [2, 3]]
    assert len({h.id for h in handles}) == 2


@pytest.mark.django_db(transaction=True)
def test_the_same_checks_as_the_real_enqueue(on, settings):
    with pytest.raises(TaskArgumentError, match="missing a required argument: 'label'"):
        tt.echo.enqueue()
    with pytest.raises(ArgumentEncodingError, match="Positional argument 1"):
        tt.echo.enqueue("x", object())
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 50}
    with pytest.raises(PayloadTooLarge):
        tt.echo.enqueue("x" * 100)
    assert not Ledger.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_atomic_tasks_writes_roll_back_with_its_failure(quiet):
    handle = tt.writes_then_breaks.enqueue("atomic")
    assert handle.status == "dead"
    assert not Ledger.objects.filter(label="atomic").exists()


@pytest.mark.django_db(transaction=True)
def test_an_atomic_task_returning_a_coroutine_is_dead_and_rolled_back(quiet):
    from tests.testapp import tasks

    handle = tasks.atomic_returns_coroutine.enqueue("co")
    assert handle.status == "dead"
    assert "awaitable" in handle.record.last_error
    assert not Ledger.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_async_tasks_and_async_enqueue(on):
    assert tt.async_echo.enqueue("hi").state().result == "HI"
    handle = async_to_sync(tt.async_echo.aenqueue)("ho")
    assert handle.state().result == "HO"
    [many] = async_to_sync(tt.async_echo.aenqueue_many)([("hu",)])
    assert many.state().result == "HU"


@pytest.mark.django_db(transaction=True)
def test_a_result_a_worker_could_not_store_is_dropped_with_a_warning(on, caplog):
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        handle = tt.returns_object.enqueue("obj")
    assert (handle.status, handle.state().result) == ("succeeded", None)
    assert "is not storable JSON" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_dedup_key_keeps_one_pending_message_per_transaction(on):
    with transaction.atomic():
        first = tt.echo.using(dedup_key="k").enqueue("d1")
        again = tt.echo.using(dedup_key="k").enqueue("d2")
        assert again is first
    assert list(Ledger.objects.values_list("label", flat=True)) == ["d1"]
    # Finished: the key is free, as in the queue.
    later = tt.echo.using(dedup_key="k").enqueue("d3")
    assert later.id != first.id and later.status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_delays_do_not_wait(on):
    handle = tt.echo.using(delay=3600).enqueue("soon")
    assert handle.status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_the_immediate_helper_as_context_manager_and_decorator():
    with immediate():
        assert tt.echo.enqueue("cm").status == "succeeded"
    with immediate(raise_errors=False):
        assert tt.breaks.enqueue("cm2").status == "dead"
    handle = tt.echo.enqueue("real")  # off again: a real message
    assert Message.objects.filter(pk=handle.id).exists()

    @immediate()
    def decorated():
        return tt.echo.enqueue("deco").status

    assert decorated() == "succeeded"


@pytest.mark.django_db  # a TestCase transaction: it never commits
def test_inside_a_testcase_autocommit_code_runs_at_once(on):
    handle = tt.echo.enqueue("tc")
    assert handle.status == "succeeded"
    assert Ledger.objects.filter(label="tc").exists()


@pytest.mark.django_db
def test_inside_a_testcase_a_block_of_your_own_waits_for_the_commit_hooks(
        on, django_capture_on_commit_callbacks):
    with transaction.atomic():
        handle = tt.echo.enqueue("own")
    assert handle.status == "ready"  # Django's TestCase never runs on_commit callbacks...
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            captured = tt.echo.enqueue("captured")
    assert captured.status == "succeeded"  # ...unless you ask it to.


@pytest.mark.django_db(transaction=True)
def test_a_commit_hook_before_the_enqueue_sees_it_ready_not_rolled_back(on):
    """Django empties the hook list before running any hook: that is no rollback."""
    seen: list[str] = []
    later: dict[str, ImmediateHandle] = {}
    with transaction.atomic():
        transaction.on_commit(lambda: seen.append(later["handle"].state().status))
        later["handle"] = tt.echo.enqueue("hooked")
    assert seen == ["ready"]
    assert later["handle"].status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_commit_hook_still_sees_a_savepoint_rollback_as_rolled_back(on):
    seen: list[str] = []
    later: dict[str, ImmediateHandle] = {}

    def check() -> None:
        try:
            later["dropped"].state()
        except MessageDoesNotExist:
            seen.append("rolled back")

    with transaction.atomic():
        transaction.on_commit(check)
        with transaction.atomic():
            later["dropped"] = tt.echo.enqueue("savepoint")
            transaction.set_rollback(True)
        kept = tt.echo.enqueue("kept")
    assert seen == ["rolled back"]
    assert kept.status == "succeeded"
    assert not Ledger.objects.filter(label="savepoint").exists()


def digest(label: str) -> ImmediateHandle:
    """A ``unique_for`` enqueue: after a success its key stays taken for an hour."""
    handle = tt.echo.using(dedup_key="digest", unique_for=3600).enqueue(label)
    assert isinstance(handle, ImmediateHandle)
    return handle


@pytest.mark.django_db(transaction=True)
def test_a_unique_for_period_holds_within_one_immediate_block_only():
    with immediate():
        first = digest("p1")
        assert first.status == "succeeded"
        assert digest("p2") is first  # its period runs: nothing more runs
    with immediate():  # another test, in the same thread
        fresh = digest("p3")
        assert fresh is not first and fresh.status == "succeeded"
    assert list(Ledger.objects.order_by("pk").values_list("label", flat=True)) == ["p1", "p3"]


@pytest.mark.django_db(transaction=True)
def test_a_unique_for_period_is_dropped_on_a_settings_change(on, settings):
    first = digest("s1")
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE_RAISE": True}
    assert digest("s2") is not first
    assert Ledger.objects.filter(label="s2").exists()


@pytest.mark.django_db(transaction=True)
def test_a_unique_for_period_made_in_a_rolled_back_testcase_transaction_is_dropped(on):
    test_case = transaction.atomic()
    test_case._from_testcase = True  # what Django's TestCase marks its own blocks with
    with test_case:
        first = digest("t1")
        assert first.status == "succeeded"  # ran at once, as in a TestCase
        assert digest("t2") is first
        transaction.set_rollback(True)  # the TestCase's end
    again = digest("t3")
    assert again is not first and again.status == "succeeded"
    assert list(Ledger.objects.values_list("label", flat=True)) == ["t3"]
