"""``atomic=True``: the task's writes and its ack commit together, or not at all."""

from __future__ import annotations

import datetime as dt
import functools
import gc
import threading
import warnings

import pytest
from django.utils import timezone

from django_mysqlq import InvalidTaskOptions, broker, queue_task
from django_mysqlq.messages import Runner
from django_mysqlq.models import Attempt, Message
from django_mysqlq.worker.executor import execute
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

RUNNER = Runner(worker_id="w", host="h", pid=1, thread="t")


def claim_one():
    [message] = broker.claim(["default"], 1, "w", lease_seconds=30)
    return message


def test_success_commits_the_work_and_the_ack_together():
    handle = tasks.atomic_record.enqueue("a")
    assert execute(claim_one(), RUNNER, threading.Event()) == "succeeded"
    assert list(Ledger.objects.values_list("label", flat=True)) == ["a"]
    assert not Message.objects.filter(pk=handle.id).exists()
    assert Attempt.objects.get(message_id=handle.id).result == "a"


def test_a_failure_rolls_the_work_back():
    handle = tasks.atomic_fails_after_write.enqueue("f")
    assert execute(claim_one(), RUNNER, threading.Event()) == "retried"
    assert not Ledger.objects.exists()
    assert execute(claim_one(), RUNNER, threading.Event()) == "failed"
    assert not Ledger.objects.exists()
    assert Message.objects.get(pk=handle.id).status == "dead"


def test_a_claim_recovered_while_running_rolls_the_work_back():
    handle = tasks.atomic_record.enqueue("late")
    message = claim_one()
    Message.objects.filter(pk=handle.id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert broker.recover() == [handle.id]  # a peer took the message back meanwhile
    assert execute(message, RUNNER, threading.Event()) == "lost"
    assert not Ledger.objects.exists()
    assert Message.objects.get(pk=handle.id).status == "ready"
    assert list(Attempt.objects.for_message(handle.id).values_list("outcome", flat=True)) == [
        "lost"]
    # The re-run does the work exactly once.
    assert execute(claim_one(), RUNNER, threading.Event()) == "succeeded"
    assert Ledger.objects.filter(label="late").count() == 1


def test_async_functions_cannot_be_atomic():
    async def coroutine_task():
        return None

    with pytest.raises(InvalidTaskOptions, match="atomic=True needs a plain function"):
        queue_task(atomic=True)(coroutine_task)


def _plain(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


class _AsyncCallable:
    def __init__(self) -> None:
        self.__qualname__ = "AsyncCallable"

    async def __call__(self) -> None:
        return None


def test_async_functions_under_a_plain_decorator_or_async_call_cannot_be_atomic():
    async def coroutine_task():
        return None

    with pytest.raises(InvalidTaskOptions, match="atomic=True needs a plain function"):
        queue_task(atomic=True, name="tests.wrapped_async_atomic")(_plain(coroutine_task))
    with pytest.raises(InvalidTaskOptions, match="atomic=True needs a plain function"):
        queue_task(atomic=True, name="tests.async_callable_atomic")(_AsyncCallable())


def test_an_atomic_task_returning_a_coroutine_fails_and_rolls_back_rather_than_succeeding():
    handle = tasks.atomic_returns_coroutine.enqueue("co")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert execute(claim_one(), RUNNER, threading.Event()) == "retried"
        gc.collect()
    # Closed, not left unawaited; the sync write before it rolled back with the attempt.
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert not Ledger.objects.exists()
    [attempt] = Attempt.objects.for_message(handle.id)
    assert attempt.error_class == "django_mysqlq.exceptions.InvalidTaskOptions"
    assert "awaitable" in attempt.error_message
    assert execute(claim_one(), RUNNER, threading.Event()) == "failed"
    assert Message.objects.get(pk=handle.id).status == "dead"
    assert not Ledger.objects.exists()
