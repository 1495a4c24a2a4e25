"""Retry control from the task, with real workers: ``retry_on``, ``dont_retry``,
``raise Retry(...)``, a backoff schedule, ``takes_context``; and the same in the test mode."""

from __future__ import annotations

import datetime as dt
import itertools
import json

import pytest

from django_mysqlq import InvalidTaskOptions, Retry, TaskArgumentError, TaskContext
from django_mysqlq.models import Attempt, Message
from django_mysqlq.retries import decide
from tests.testapp import cron_tasks
from tests.testapp.models import Ledger

CRON_MODULE = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.cron_tasks"}


def outcomes(message_id: int) -> list[str]:
    return list(Attempt.objects.for_message(message_id).values_list("outcome", flat=True))


def burst(start_worker, *args: str) -> str:
    # The cron module's schedules fire in this worker too, into the queue it leaves alone.
    worker = start_worker("--burst", "--exit-zero", "--burst-wait", "5", "--queues",
                          "default", *args, env=CRON_MODULE)
    assert worker.wait(90) == 0, worker.output()
    return worker.output()


# ----------------------------------------------------------------- the decision alone

class A(Exception):
    pass


class B(A):
    pass


@pytest.mark.parametrize("error, options, expected", [
    (ValueError(), {}, True),
    (ValueError(), {"retry_on": (A,)}, False),
    (B(), {"retry_on": (A,)}, True),
    (B(), {"retry_on": (A,), "dont_retry": (B,)}, False),  # dont_retry wins
    (A(), {"retry_on": (A,), "dont_retry": (B,)}, True),
    (KeyError(), {"dont_retry": (LookupError,)}, False),
    (Retry(5), {"retry_on": (A,)}, True),  # asked for: retry_on doesn't apply
    (Retry(5), {"dont_retry": (Exception,)}, True),
])
def test_which_errors_retry(error, options, expected):
    assert decide(error, 1, **options).retry is expected


def test_the_delay_a_decision_gives():
    now = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    schedule = (1.0, 5.0, 30.0)
    assert [decide(ValueError(), n, schedule=schedule).delay for n in (1, 2, 3, 4, 9)] == [
        1.0, 5.0, 30.0, 30.0, 30.0]
    assert decide(ValueError(), 1).delay is None  # the exponential backoff
    assert decide(Retry(in_seconds=7), 1, schedule=schedule).delay == 7.0
    assert decide(Retry(), 2, schedule=schedule).delay == 5.0
    assert decide(Retry(at=now + dt.timedelta(seconds=90)), 1, now=lambda: now).delay == 90
    assert decide(Retry(at=now - dt.timedelta(hours=1)), 1, now=lambda: now).delay == 0


@pytest.mark.parametrize("kwargs, fragment", [
    ({"in_seconds": -1}, "Retry(in_seconds=...) must be a finite number"),
    ({"in_seconds": float("nan")}, "finite number"),
    ({"in_seconds": 1, "at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)}, "not both"),
    ({"at": dt.datetime(2030, 1, 1)}, "timezone-aware"),
    # Past 100 years the retry's date arithmetic overflowed on the server.
    ({"at": dt.datetime.max.replace(tzinfo=dt.UTC)}, "100 years from now"),
    ({"at": dt.datetime.now(dt.UTC) + dt.timedelta(days=365 * 101)}, "100 years from now"),
])
def test_a_bad_retry_request_says_what_is_wrong(kwargs, fragment):
    with pytest.raises(InvalidTaskOptions) as caught:
        Retry(**kwargs)
    assert fragment in str(caught.value)


def test_retry_on_dont_retry_and_takes_context_are_checked_when_declared():
    from django_mysqlq import queue_task

    def f(x: int) -> None: ...

    with pytest.raises(InvalidTaskOptions, match="retry_on must be an exception class"):
        queue_task(name="tests.rc.a", retry_on=("ValueError",))(f)
    with pytest.raises(InvalidTaskOptions, match="can't list Retry"):
        queue_task(name="tests.rc.b", dont_retry=Retry)(f)
    with pytest.raises(InvalidTaskOptions, match="retry_backoff\\[1\\] must be"):
        queue_task(name="tests.rc.c", retry_backoff=[1, "5"])(f)
    with pytest.raises(InvalidTaskOptions, match="takes_context must be True or False"):
        queue_task(name="tests.rc.d", takes_context="yes")(f)

    def no_parameter() -> None: ...

    with pytest.raises(InvalidTaskOptions, match="its first parameter receives the task"):
        queue_task(name="tests.rc.e", takes_context=True)(no_parameter)


def test_a_backoff_schedule_keeps_its_first_delay_for_older_workers():
    assert cron_tasks.stepped.retry_schedule == (0.2, 1.5, 0.4)
    assert cron_tasks.stepped.retry_backoff == 0.2  # what the message row carries


def test_the_context_parameter_is_not_an_enqueue_argument():
    with pytest.raises(TaskArgumentError, match="It takes \\(label: str\\)"):
        cron_tasks.shows_context.call("a", "b")
    cron_tasks.shows_context.call("a")  # fits: the context is the worker's to give


# --------------------------------------------------------------------- real workers



@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_retry_on_and_dont_retry_against_a_worker(start_worker):
    transient = cron_tasks.raises_named.enqueue("transient", "transient")
    permanent = cron_tasks.raises_named.enqueue("permanent", "permanent")
    narrow = cron_tasks.raises_named.enqueue("narrow", "narrow")
    key_error = cron_tasks.dont_retry_key_error.enqueue("key")
    output = burst(start_worker)
    assert outcomes(transient.id) == ["retried", "retried", "retried", "failed"]
    assert outcomes(permanent.id) == ["failed"]  # not in retry_on: dead at once
    assert outcomes(narrow.id) == ["failed"]  # in dont_retry, which wins
    assert outcomes(key_error.id) == ["failed"]
    assert Message.objects.get(pk=permanent.id).attempts == 1
    assert Message.objects.get(pk=permanent.id).last_error.endswith("Permanent: permanent")
    assert "detail=now dead: Permanent is not in retry_on, so it is not retried" in output
    assert "detail=now dead: NarrowPermanent is in dont_retry, so it is not retried" in output
    assert "detail=now dead: no attempts left" in output
    assert Ledger.objects.filter(label="permanent").count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_task_asks_for_its_own_retry_with_a_delay(start_worker):
    handle = cron_tasks.asks_for_retry.enqueue("again", 1.2)
    output = burst(start_worker)
    attempts = list(Attempt.objects.for_message(handle.id))
    assert [a.outcome for a in attempts] == ["retried", "retried", "succeeded"]
    assert attempts[0].error_class == "django_mysqlq.exceptions.Retry"
    assert "asked to be retried in 1.2s: attempt 1 wants more" in attempts[0].error_message
    for earlier, later in itertools.pairwise(attempts):
        assert later.started_at - earlier.finished_at >= dt.timedelta(seconds=1.1)
    assert attempts[-1].result == "done on 3"
    assert "detail=the task asked for a retry after 1.2s" in output
    # It counts against max_attempts: one that always asks ends dead, not in a loop.
    endless = cron_tasks.always_asks_for_retry.enqueue("endless")
    output = burst(start_worker)
    assert outcomes(endless.id) == ["retried", "failed"]
    assert "now dead: no attempts left (the task asked for a retry after 0s)" in output


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_backoff_schedule_spaces_the_retries_step_by_step(start_worker):
    handle = cron_tasks.stepped.enqueue("steps")
    burst(start_worker)
    attempts = list(Attempt.objects.for_message(handle.id))
    assert [a.outcome for a in attempts] == ["retried", "retried", "retried", "failed"]
    gaps = [(later.started_at - earlier.finished_at).total_seconds()
            for earlier, later in itertools.pairwise(attempts)]
    # The n-th retry waits the n-th delay (no jitter): 0.2, 1.5, 0.4 seconds.
    assert gaps[0] >= 0.2 and gaps[1] >= 1.5 and gaps[2] >= 0.4
    assert gaps[1] > gaps[0] and gaps[1] > gaps[2]


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_takes_context_gives_the_attempt_to_the_function(start_worker):
    handle = cron_tasks.shows_context.enqueue("ctx")
    atomic = cron_tasks.atomic_with_context.enqueue("atomic-ctx")
    burst(start_worker)
    [attempt] = Attempt.objects.for_message(handle.id)
    seen = attempt.result
    assert seen["message_id"] == handle.id and seen["attempt"] == 1
    assert (seen["max_attempts"], seen["queue"], seen["task_name"], seen["subject"]) == (
        3, "default", cron_tasks.shows_context.name, None)
    assert dt.datetime.fromisoformat(seen["enqueued_at"]) == attempt.enqueued_at
    assert Attempt.objects.get(message_id=atomic.id).result == atomic.id


# ------------------------------------------------------------------------ test mode

@pytest.mark.django_db(transaction=True)
def test_the_test_mode_passes_the_context_and_a_retry_request_ends_the_message(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE": True, "IMMEDIATE_RAISE": False}
    handle = cron_tasks.shows_context.enqueue("immediate")
    state = handle.state()
    assert state.status == "succeeded" and state.result["attempt"] == 1
    assert state.result["message_id"] == handle.id
    asked = cron_tasks.always_asks_for_retry.enqueue("immediate-retry")
    assert asked.state().status == "dead"  # one attempt in the test mode, as any failure
    assert "Retry" in asked.state().last_error


def test_the_context_is_a_plain_value_a_task_can_log():
    context = TaskContext(message_id=1, task_name="t", queue="q", attempt=3,
                          max_attempts=3, enqueued_at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC))
    assert context.is_last_attempt and context.subject is None
    assert json.dumps({"id": context.message_id})
