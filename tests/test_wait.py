"""``handle.wait()`` and ``await handle.await_result()`` against real workers: the outcome
and the value, dead messages, timeouts, and how few queries a wait sends."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.db import connection, transaction

from django_mysqlq import MessageDoesNotExist, MessageHandle, WaitTimeout
from django_mysqlq.handles import WAIT_FIRST_SECONDS
from django_mysqlq.models import Worker
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def questions() -> int:
    """Statements this connection has sent (the SHOW itself counts one)."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


def running(start_worker):
    worker = start_worker("--concurrency", "2")
    wait_for(lambda: Worker.objects.filter(pid=worker.pid).exists(), 20,
             message="the worker to register")
    return worker


def test_wait_returns_the_value_of_a_success(start_worker):
    running(start_worker)
    result = tasks.record.enqueue("waited", value=41).wait(timeout=30)
    assert result.succeeded and result.status == "succeeded"
    assert (result.value, result.error, result.attempts) == (41, "", 1)
    assert result.finished_at is not None


def test_wait_returns_a_dead_message_with_its_error(start_worker):
    running(start_worker)
    result = tasks.always_fails.enqueue("doomed").wait(timeout=60)
    assert not result.succeeded and result.status == "dead"
    assert result.error == "builtins.ValueError: boom doomed"
    assert result.attempts == 3 and result.value is None and result.finished_at


def test_wait_times_out_with_a_clear_error_and_few_queries(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "POLL_SECONDS": 1.0}  # the default
    handle = tasks.on_other_queue.enqueue("nobody serves it")
    before = questions()
    began = time.monotonic()
    with pytest.raises(WaitTimeout) as caught:
        handle.wait(timeout=3)
    assert 3 <= time.monotonic() - began < 6
    sent = questions() - before - 1
    # Pauses of 10 ms doubling to 1 s: 7 reads in the first second, then one a second.
    assert sent <= 7 + 3 + 1, sent
    assert (f"Message {handle.id} (tests.testapp.tasks.on_other_queue) is still ready after "
            "3s") in str(caught.value)
    assert "It goes on in the queue" in str(caught.value)
    assert isinstance(caught.value, TimeoutError)


def test_wait_sleeps_through_a_scheduled_message_until_its_time(start_worker, settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "POLL_SECONDS": 1.0}
    running(start_worker)
    handle = tasks.record.using(delay=4).enqueue("later", value=7)
    before = questions()
    assert handle.wait(timeout=30).value == 7
    sent = questions() - before - 1
    # Without the sleep to run_at it would read ~7 times in the first second and then
    # once a second: about 11 reads before the message even starts.
    assert sent <= 7, sent


def test_await_result_is_the_async_twin(start_worker):
    running(start_worker)
    handle = tasks.async_record.enqueue("awaited")

    async def main() -> object:
        return await handle.await_result(timeout=30)

    result = asyncio.run(main())
    assert result.succeeded and result.value == "awaited"
    with pytest.raises(WaitTimeout):
        asyncio.run(tasks.record.using(queue="nobody").enqueue("x").await_result(timeout=0.3))


def test_wait_inside_the_enqueuing_transaction_is_refused_at_once():
    with transaction.atomic():
        handle = tasks.record.enqueue("not yet committed")
        began = time.monotonic()
        with pytest.raises(RuntimeError, match="reaches no worker before it commits"):
            handle.wait(timeout=30)
        assert time.monotonic() - began < 1


def test_waiting_on_a_message_that_does_not_exist_says_so():
    with pytest.raises(MessageDoesNotExist):
        MessageHandle(10**12, "tests.testapp.tasks.record").wait(timeout=5)
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        MessageHandle(1, "t").wait(timeout=-1)


def test_the_first_pause_is_short():
    assert WAIT_FIRST_SECONDS <= 0.01


def test_the_test_mode_returns_at_once(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE": True, "IMMEDIATE_RAISE": False}
    assert tasks.record.enqueue("now", value=3).wait().value == 3
    done = tasks.record.enqueue("now", value=4).wait()
    # "returns the outcome and the return value" (issue 13): the aliases say so too.
    assert (done.outcome, done.result) == ("succeeded", 4) == (done.status, done.value)
    dead = tasks.always_fails.enqueue("now-dead").wait()
    assert dead.status == "dead" and "boom now-dead" in dead.error
    assert (dead.outcome, dead.result) == ("dead", None)
    with transaction.atomic():
        pending = tasks.record.enqueue("at the commit")
        with pytest.raises(WaitTimeout, match="runs in this process when the transaction"):
            pending.wait(timeout=10)
    assert pending.wait().succeeded
    assert asyncio.run(pending.await_result()).succeeded
