"""Enqueue: transactional, JSON-only, options validated, bulk path, dedup."""

from __future__ import annotations

import datetime as dt

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.utils import timezone

from django_mysqlq import (
    ArgumentEncodingError,
    InvalidTaskOptions,
    MessageDoesNotExist,
    PayloadTooLarge,
    queue_task,
)
from django_mysqlq.models import Attempt, Message
from django_mysqlq.registry import registry
from django_mysqlq.signals import message_enqueued
from tests.testapp import tasks
from tests.testapp.unique_tasks import unique_while_queued

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_writes_one_ready_message_with_the_task_options():
    handle = tasks.record.enqueue("a", value=3)
    message = Message.objects.get(pk=handle.id)
    assert message.task_name == "tests.testapp.tasks.record"
    assert message.queue == "default"
    assert message.status == "ready"
    assert message.priority == 0
    assert message.attempts == 0
    assert message.decoded_payload() == {"args": ["a"], "kwargs": {"value": 3}}
    assert handle.status == "ready"


def test_calling_the_task_runs_it_inline_without_a_message():
    assert tasks.record("inline", 7) == 7
    assert not Message.objects.exists()


def test_enqueue_inside_a_rolled_back_transaction_leaves_nothing():
    with transaction.atomic():
        handle = tasks.record.enqueue("never")
        assert Message.objects.filter(pk=handle.id).exists()
        transaction.set_rollback(True)
    assert not Message.objects.exists()
    with pytest.raises(MessageDoesNotExist):
        handle.state()


def test_enqueue_joins_the_callers_transaction_and_announces_after_commit():
    seen: list[list[int]] = []

    def receiver(sender, message_ids, **kwargs):
        seen.append(message_ids)

    message_enqueued.connect(receiver)
    try:
        with transaction.atomic():
            handle = tasks.record.enqueue("joined")
            assert seen == []
        assert seen == [[handle.id]]
    finally:
        message_enqueued.disconnect(receiver)


def test_enqueue_many_of_a_unique_task_announces_once_after_commit():
    # Its calls are enqueued one by one (each key checked), yet the call sends one
    # message_enqueued, with the new ids only (the repeated key wrote nothing).
    seen: list[tuple[str, list[int]]] = []

    def receiver(sender, message_ids, **kwargs):
        seen.append((sender, message_ids))

    message_enqueued.connect(receiver)
    try:
        with transaction.atomic():
            a, b, again = unique_while_queued.enqueue_many([("a",), ("b",), ("a",)])
            assert seen == []
        assert again.id == a.id != b.id
        assert seen == [(unique_while_queued.name, [a.id, b.id])]
        c, b_again = unique_while_queued.enqueue_many([("c",), ("b",)])  # autocommit
        assert b_again.id == b.id
        assert seen[1:] == [(unique_while_queued.name, [c.id])]
    finally:
        message_enqueued.disconnect(receiver)


def test_unencodable_argument_names_the_argument_and_writes_nothing():
    with pytest.raises(ArgumentEncodingError, match=r"Argument 'value'.*JSON") as info:
        tasks.record.enqueue("x", value=object())
    assert isinstance(info.value, TypeError)
    with pytest.raises(ArgumentEncodingError, match="Positional argument 0"):
        tasks.record.enqueue({1, 2})
    with pytest.raises(ArgumentEncodingError, match="Positional argument 1"):
        tasks.record.enqueue("x", float("nan"))
    assert not Message.objects.exists()


def test_bulk_encoding_error_writes_none_of_the_batch():
    with pytest.raises(ArgumentEncodingError):
        tasks.record.enqueue_many([["ok"], ["ok2"], [dt.date.today()]])
    assert not Message.objects.exists()


def test_payload_over_the_limit_is_refused(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 100}
    with pytest.raises(PayloadTooLarge, match="MAX_PAYLOAD_BYTES"):
        tasks.record.enqueue("x" * 200)
    assert not Message.objects.exists()


def test_enqueue_many_uses_one_insert_and_keeps_order():
    calls = [tasks.record.call(f"m{i}", value=i) for i in range(2500)]
    with connection.execute_wrapper(_count_inserts) as _:
        _INSERTS.clear()
        handles = tasks.record.enqueue_many(calls)
    assert len(handles) == 2500
    assert [h.id for h in handles] == sorted(h.id for h in handles)
    # 1,000 rows per statement.
    assert len(_INSERTS) == 3
    first = Message.objects.get(pk=handles[0].id)
    last = Message.objects.get(pk=handles[-1].id)
    assert first.decoded_payload()["kwargs"] == {"value": 0}
    assert last.decoded_payload()["kwargs"] == {"value": 2499}


_INSERTS: list[str] = []


def _count_inserts(execute, sql, params, many, context):
    if sql.lstrip().upper().startswith("INSERT INTO MYSQLQ_MESSAGE"):
        _INSERTS.append(sql)
    return execute(sql, params, many, context)


def test_enqueue_many_accepts_argument_lists_and_calls():
    handles = tasks.record.enqueue_many([["a"], ("b", 2), tasks.record.call("c", value=3),
                                         (["x"], {"y": 1})])
    payloads = [Message.objects.get(pk=h.id).decoded_payload() for h in handles]
    assert payloads == [
        {"args": ["a"], "kwargs": {}},
        {"args": ["b", 2], "kwargs": {}},
        {"args": ["c"], "kwargs": {"value": 3}},
        # A list then a dict are two positional arguments, never (args, kwargs).
        {"args": [["x"], {"y": 1}], "kwargs": {}},
    ]


@pytest.mark.parametrize("item", [5, "ab", {"args": []}, None])
def test_enqueue_many_refuses_items_that_are_not_calls(item):
    with pytest.raises(InvalidTaskOptions, match=r"Item 1 of enqueue_many\(\).*\.call\("):
        tasks.record.enqueue_many([["ok"], item])
    assert not Message.objects.exists()


def test_using_sets_per_call_options_without_changing_the_task():
    handle = tasks.record.using(queue="emails", priority=50).enqueue("p")
    message = Message.objects.get(pk=handle.id)
    assert (message.queue, message.priority) == ("emails", 50)
    plain = Message.objects.get(pk=tasks.record.enqueue("q").id)
    assert (plain.queue, plain.priority) == ("default", 0)


def test_delay_and_run_at_make_scheduled_messages():
    delayed = Message.objects.get(pk=tasks.record.using(delay=60).enqueue("d").id)
    assert delayed.status == "scheduled"
    assert delayed.run_at > timezone.now() + dt.timedelta(seconds=50)
    by_timedelta = tasks.record.using(delay=dt.timedelta(minutes=2)).enqueue("t")
    assert Message.objects.get(pk=by_timedelta.id).status == "scheduled"
    when = timezone.now() + dt.timedelta(hours=1)
    at = Message.objects.get(pk=tasks.record.using(run_at=when).enqueue("r").id)
    assert at.status == "scheduled"
    assert abs((at.run_at - when).total_seconds()) < 0.001
    past = Message.objects.get(pk=tasks.record.using(run_at=timezone.now() - dt.timedelta(
        seconds=5)).enqueue("past").id)
    assert past.status == "ready"


@pytest.mark.parametrize("options, match", [
    ({"priority": 101}, "priority must be an integer from -100 to 100"),
    ({"priority": -101}, "priority"),
    ({"priority": True}, "priority"),
    ({"queue": ""}, "queue must be a non-empty string"),
    ({"queue": "q" * 65}, "at most 64"),
    ({"delay": -1}, "delay must be"),
    ({"run_at": dt.datetime(2030, 1, 1)}, "timezone-aware"),
    ({"dedup_key": ""}, "dedup_key"),
    ({"delay": 1, "run_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)}, "either delay or run_at"),
])
def test_bad_options_are_refused_with_what_to_do(options, match):
    with pytest.raises(InvalidTaskOptions, match=match):
        tasks.record.using(**options)


def test_bad_decorator_options_are_refused():
    with pytest.raises(InvalidTaskOptions, match="max_attempts"):
        queue_task(max_attempts=0)(lambda: None)
    with pytest.raises(InvalidTaskOptions, match="retry_backoff"):
        queue_task(retry_backoff=-1)(lambda: None)
    with pytest.raises(InvalidTaskOptions, match="timeout"):
        queue_task(timeout=0)(lambda: None)


@pytest.mark.parametrize("value", ["false", 0, 1, None])
def test_atomic_takes_true_or_false_only(value):
    # atomic="false" is truthy: it would have run the task in one transaction.
    with pytest.raises(InvalidTaskOptions, match=f"atomic must be True or False, not {value!r}"):
        queue_task(atomic=value, name="tests.enqueue.atomic")(lambda: None)


def test_dedup_key_keeps_one_unfinished_message_per_key():
    first = tasks.record.using(dedup_key="order-7").enqueue("a")
    second = tasks.record.using(dedup_key="order-7").enqueue("b")
    assert first.id == second.id
    assert Message.objects.count() == 1
    with pytest.raises(InvalidTaskOptions, match="dedup_key"):
        tasks.record.using(dedup_key="k").enqueue_many([["a"], ["b"]])


def test_dedup_inside_an_outer_transaction_keeps_that_transaction_usable():
    with transaction.atomic():
        tasks.record.using(dedup_key="k1").enqueue("a")
        again = tasks.record.using(dedup_key="k1").enqueue("b")
        other = tasks.record.enqueue("c")
    assert Message.objects.filter(pk__in=[again.id, other.id]).count() == 2


def test_tasks_register_under_their_module_path_and_names_cannot_clash():
    assert registry.get("tests.testapp.tasks.record") is tasks.record

    def some_function():
        return None

    first = queue_task(name="tests.clash")(some_function)
    assert registry.get("tests.clash") is first

    def another_function():
        return None

    from django_mysqlq import TaskAlreadyRegistered

    with pytest.raises(TaskAlreadyRegistered, match="name="):
        queue_task(name="tests.clash")(another_function)


def test_handle_reads_history_once_the_message_finished():
    handle = tasks.record.enqueue("h")
    Message.objects.filter(pk=handle.id).delete()
    Attempt.objects.create(message_id=handle.id, queue="default", task_name=handle.task_name,
                           attempt=1, outcome="succeeded", enqueued_at=timezone.now(),
                           finished_at=timezone.now(), result=5)
    state = handle.state()
    assert state.status == "succeeded"
    assert state.result == 5
    assert state.is_finished


def test_async_enqueue_twins():
    async def scenario():
        handle = await tasks.record.aenqueue("async")
        state = await handle.astate()
        handles = await tasks.record.aenqueue_many([["x"], ["y"]])
        return state, handles

    state, handles = async_to_sync(scenario)()
    assert state.status == "ready"
    assert len(handles) == 2
    assert Message.objects.count() == 3


def test_a_dead_message_gives_its_dedup_key_up():
    from django_mysqlq import broker
    from django_mysqlq.messages import AttemptResult, Runner

    first = tasks.record.using(dedup_key="job-1").enqueue("a")
    [claimed] = broker.claim(["default"], 1, "w", lease_seconds=30)
    broker.fail(claimed, Runner("w", "h", 1, "t"),
                AttemptResult(started_at=timezone.now(), error_class="E"), retry=False)
    assert Message.objects.get(pk=first.id).status == "dead"
    second = tasks.record.using(dedup_key="job-1").enqueue("b")
    assert second.id != first.id
    assert Message.objects.get(pk=second.id).status == "ready"
