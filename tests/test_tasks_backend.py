"""MySQLQueueBackend against Django's Tasks contract, on the real MariaDB and real workers.

The scenarios follow Django's own backend tests (enqueue, defer, priority, results,
errors, context, async, invalid tasks), run on Django 6 (``django.tasks``) and on Django
5.2 with the ``django-tasks`` backport alike. Task functions: tests/testapp/djtasks.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import sys
import time

import pytest
from asgiref.sync import async_to_sync
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import transaction
from django.utils import timezone

compat = pytest.importorskip("django_mysqlq.backend.compat",
                             reason="needs django.tasks (Django 6) or django-tasks")

from django_mysqlq import ArgumentEncodingError, broker  # noqa: E402
from django_mysqlq.backend import MySQLQueueBackend, MySQLQueueTask, WorkerLost  # noqa: E402
from django_mysqlq.backend import checks as backend_checks  # noqa: E402
from django_mysqlq.messages import NewMessage  # noqa: E402
from django_mysqlq.models import Attempt, Message  # noqa: E402
from tests.burst import expected_status  # noqa: E402
from tests.conftest import wait_for  # noqa: E402
from tests.testapp import djtasks  # noqa: E402
from tests.testapp import tasks as queue_tasks  # noqa: E402
from tests.testapp.models import Ledger  # noqa: E402

InvalidTask = compat.InvalidTask
TaskResultDoesNotExist = compat.TaskResultDoesNotExist
TaskResultStatus = compat.TaskResultStatus
task_backends = compat.task_backends
task = djtasks.task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.compat]

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def run_burst(start_worker, *args: str, env: dict[str, str] | None = None) -> str:
    worker = start_worker("--burst", "--burst-wait", "10", *args, env=env)
    status = worker.wait(timeout=90)
    output = worker.output()
    dead = int(re.findall(r"^Summary: .* dead=(\d+) ", output, re.M)[-1])
    assert status == expected_status(dead, args), output
    return output


def module_level(value):
    return value


def no_context(value):
    return value


# --------------------------------------------------------------------------- the backend


def test_the_backend_supports_everything_django_asks_about():
    backend = task_backends["default"]
    assert isinstance(backend, MySQLQueueBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task
    assert isinstance(djtasks.add, MySQLQueueTask)
    assert djtasks.add.get_backend() is backend


def test_enqueue_writes_one_ready_message_and_returns_its_result():
    result = djtasks.add.enqueue(2, 3)
    assert result.status == READY and not result.is_finished
    assert result.id.isdigit() and result.task == djtasks.add and result.backend == "default"
    assert (result.args, result.kwargs) == ([2, 3], {})
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert result.started_at is result.finished_at is result.last_attempted_at is None
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    message = Message.objects.get(pk=int(result.id))
    assert message.task_name == "django.tasks:tests.testapp.djtasks.add"
    assert (message.queue, message.priority, message.status) == ("default", 0, "ready")
    assert (message.max_attempts, message.retry_backoff) == (3, 0.1)  # backend OPTIONS
    assert json.loads(message.payload) == {"args": [2, 3], "kwargs": {}, "backend": "default"}
    assert result.enqueued_at == message.enqueued_at

    again = task_backends["default"].get_result(result.id)
    assert (again.id, again.status, again.args, again.task) == (result.id, READY, [2, 3],
                                                                 djtasks.add)
    assert again.enqueued_at == result.enqueued_at
    assert djtasks.add.get_result(result.id).id == result.id
    with pytest.raises(compat.TaskResultMismatch):
        djtasks.record.get_result(result.id)


def test_arguments_are_normalized_like_djangos_task_result():
    result = djtasks.record.enqueue("n", value=[1, (2, 3)])
    assert result.kwargs == {"value": [1, [2, 3]]}
    assert task_backends["default"].get_result(result.id).kwargs == {"value": [1, [2, 3]]}


def test_arguments_that_are_not_json_are_refused_with_djangos_message_and_their_name():
    # What Django's own backend says for the same call, word for word.
    with pytest.raises(TypeError) as django_says:
        djtasks.immediate_only.enqueue(dt.datetime.now())
    with pytest.raises(ValueError) as django_says_bytes:
        djtasks.immediate_only.enqueue(b"\xff")
    assert str(django_says.value) == "Unsupported type: <class 'datetime.datetime'>"

    with pytest.raises(ArgumentEncodingError) as caught:
        djtasks.add.enqueue(dt.datetime.now(), 1)
    assert str(caught.value).startswith(
        f"{django_says.value} (positional argument 0 of task 'tests.testapp.djtasks.add'). "
        "Task arguments must be JSON values")
    assert isinstance(caught.value, TypeError)
    with pytest.raises(TypeError, match=r"^Unsupported type: <class 'set'> \(argument "
                                        r"'value' of task 'tests.testapp.djtasks.record'\)"):
        djtasks.record.enqueue("x", value={1, 2})
    with pytest.raises(ValueError) as bad_bytes:  # a ValueError, as Django raises it
        djtasks.record.enqueue("x", value=[b"\xff"])
    assert isinstance(bad_bytes.value, ArgumentEncodingError)
    assert str(bad_bytes.value).startswith(f"{django_says_bytes.value} (argument 'value' of ")
    assert not Message.objects.exists()


def test_enqueue_joins_the_callers_transaction_and_signals_after_commit():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id))

    compat.task_enqueued.connect(receiver)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            rolled_back = djtasks.add.enqueue(1, 1)
            assert task_backends["default"].get_result(rolled_back.id).status == READY
            raise RuntimeError("roll back")
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(rolled_back.id)

        with transaction.atomic():
            committed = djtasks.add.enqueue(1, 2)
            assert seen == []
        assert seen == [(MySQLQueueBackend, committed.id)]
    finally:
        compat.task_enqueued.disconnect(receiver)
    assert list(Message.objects.values_list("pk", flat=True)) == [int(committed.id)]


def test_async_enqueue_and_get_result():
    result = async_to_sync(djtasks.add.aenqueue)(4, 5)
    fetched = async_to_sync(task_backends["default"].aget_result)(result.id)
    assert (fetched.id, fetched.args, fetched.status) == (result.id, [4, 5], READY)
    assert async_to_sync(djtasks.add.aget_result)(result.id).id == result.id
    async_to_sync(result.arefresh)()
    assert result.status == READY


@pytest.mark.parametrize("result_id", ["999999999", "abc", "", "12x", "-1", "1" * 30,
                                       "\u00b2", "\u0661\u0662\u0663"])  # (not ASCII digits)
def test_unknown_result_ids_do_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


def test_a_queue_task_message_is_not_a_django_task_result():
    handle = queue_tasks.record.enqueue("q")
    with pytest.raises(TaskResultDoesNotExist, match="@queue_task"):
        task_backends["default"].get_result(str(handle.id))


def test_a_result_belongs_to_the_backend_that_enqueued_it():
    result = djtasks.add.using(backend="single").enqueue(1, 1)
    assert result.backend == "single" and result.task.backend == "single"
    assert task_backends["single"].get_result(result.id).backend == "single"
    with pytest.raises(TaskResultDoesNotExist, match="belongs to the backend 'single'"):
        task_backends["default"].get_result(result.id)


def test_options_per_backend_and_per_task():
    def stored(result):
        message = Message.objects.get(pk=int(result.id))
        return message.max_attempts, message.retry_backoff

    assert stored(djtasks.fails_once.enqueue("a")) == (1, 0.1)   # task, then backend
    assert stored(djtasks.two_tries.enqueue("b")) == (2, 0.0)    # the task's own
    assert stored(djtasks.add.using(backend="single").enqueue(1, 2))[0] == 1
    assert Message.objects.get(pk=int(djtasks.timed.enqueue(1).id)).timeout == 30.0


def test_priority_and_queue_are_stored():
    result = djtasks.add.using(priority=42, queue_name="other").enqueue(1, 1)
    message = Message.objects.get(pk=int(result.id))
    assert (message.priority, message.queue) == (42, "other")
    fetched = task_backends["default"].get_result(result.id)
    assert (fetched.task.priority, fetched.task.queue_name) == (42, "other")


# --------------------------------------------------------------------------- invalid tasks


def test_invalid_tasks_are_refused(settings):
    def local_function():
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(local_function)
    for priority in (101, -101, 1.5):
        with pytest.raises(InvalidTask, match="priority"):
            djtasks.add.using(priority=priority)
    with pytest.raises(InvalidTask, match="aware"):
        djtasks.add.using(run_after=dt.datetime.now())
    with pytest.raises(InvalidTask, match="not valid for backend"):
        djtasks.add.using(queue_name="nope")
    with pytest.raises(InvalidTask, match="context"):
        task(takes_context=True)(no_context)
    with pytest.raises(InvalidTask, match="max_attempts"):
        task(max_attempts=0)(module_level)
    with pytest.raises(InvalidTask, match="retry_backoff"):
        task(retry_backoff=-1)(module_level)
    with pytest.raises(InvalidTask, match="timeout"):
        task(timeout=0)(module_level)
    with pytest.raises(TypeError):
        task(no_such_option=1)(module_level)
    with pytest.raises(TypeError, match="run_after"):
        task(run_after=timezone.now())(module_level)

    settings.TASKS = {**settings.TASKS, "commas": {
        "BACKEND": "django_mysqlq.backend.MySQLQueueBackend", "QUEUES": ["a,b"]}}
    with pytest.raises(InvalidTask, match="without commas"):
        task(backend="commas", queue_name="a,b")(module_level)


@pytest.mark.parametrize(("options", "fragment"), [
    ({"max_attempts": 2**40}, "from 1 to 1000000"),
    ({"retry_backoff": float("nan")}, "retry_backoff"),
    ({"retry_backoff": 1e300}, "from 0 to 3155760000"),
    ({"timeout": float("inf")}, "timeout"),
    ({"timeout": 1e300}, "at most 3155760000"),
])
def test_task_options_the_database_cant_hold_are_invalid_tasks(options, fragment):
    with pytest.raises(InvalidTask, match=fragment):
        task(**options)(module_level)
    assert not Message.objects.exists()


@pytest.mark.parametrize("run_after", [
    dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),
    dt.datetime(9000, 1, 1, tzinfo=dt.UTC),
])
def test_a_run_after_out_of_range_is_an_invalid_task(run_after):
    with pytest.raises(InvalidTask, match="run_after must lie between year 1"):
        djtasks.add.using(run_after=run_after).enqueue(1, 2)
    assert not Message.objects.exists()


def test_backend_options_the_database_cant_hold_refuse_to_enqueue(settings):
    settings.TASKS = {**settings.TASKS, "huge": {
        "BACKEND": backend_checks.BACKEND_PATH, "OPTIONS": {"max_attempts": 2**40}}}
    with pytest.raises(compat.InvalidTaskBackend, match="from 1 to 1000000"):
        djtasks.add.using(backend="huge").enqueue(1, 1)
    assert not Message.objects.exists()


# --------------------------------------------------------------------------- checks


def backend_with(**params):
    return MySQLQueueBackend("x", {"BACKEND": backend_checks.BACKEND_PATH, **params})


def ids(messages):
    return sorted(message.id for message in messages)


def test_a_good_configuration_has_no_check_messages():
    assert task_backends["default"].check() == []
    assert backend_with().check() == []
    call_command("check")


def test_check_reports_bad_queues_and_options():
    backend = backend_with(QUEUES=["ok", "a,b", "q" * 65],
                           OPTIONS={"max_attempts": 0, "retry_backof": 2})
    assert ids(backend.check()) == ["django_mysqlq.E101", "django_mysqlq.E101",
                                    "django_mysqlq.E102", "django_mysqlq.E103"]
    assert ids(backend_with(QUEUES="default").check()) == ["django_mysqlq.E101"]
    assert ids(backend_with(QUEUES=[]).check()) == ["django_mysqlq.W101"]
    assert ids(backend_with(OPTIONS="fast").check()) == ["django_mysqlq.E102"]
    [unknown] = backend_with(OPTIONS={"retries": 3}).check()
    assert "'retries'" in unknown.msg and "max_attempts" in unknown.hint


def test_an_invalid_backend_refuses_to_enqueue(settings):
    settings.TASKS = {**settings.TASKS, "broken": {
        "BACKEND": backend_checks.BACKEND_PATH, "OPTIONS": {"max_attempts": "3"}}}
    with pytest.raises(compat.InvalidTaskBackend, match="max_attempts"):
        djtasks.add.using(backend="broken").enqueue(1, 1)
    assert not Message.objects.exists()


def test_checks_run_through_djangos_check_command(settings):
    settings.TASKS = {**settings.TASKS, "typo": {
        "BACKEND": backend_checks.BACKEND_PATH, "OPTIONS": {"max_attemps": 3}}}
    with pytest.raises(SystemCheckError, match=r"django_mysqlq\.E103"):
        call_command("check")


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_database_that_is_not_mysql_is_E104(settings):
    settings.DATABASES = {**settings.DATABASES, "lite": {"ENGINE": "django.db.backends.sqlite3"}}
    settings.MYSQLQ = {"DATABASE": "lite"}
    assert ids(backend_with().check()) == ["django_mysqlq.E104"]
    settings.MYSQLQ = {"DATABASE": "nowhere"}
    assert ids(backend_with().check()) == ["django_mysqlq.E104"]


def test_the_app_missing_is_E105(monkeypatch):
    monkeypatch.setattr(backend_checks.apps, "is_installed", lambda name: False)
    assert ids(backend_with().check()) == ["django_mysqlq.E105"]


def test_no_tasks_framework_is_E106(monkeypatch):
    import django_mysqlq.backend as package

    monkeypatch.delattr(package, "compat")
    monkeypatch.setitem(sys.modules, "django_mysqlq.backend.compat", None)
    [error] = backend_checks.check_framework()
    assert isinstance(error, Error) and error.id == "django_mysqlq.E106"


# --------------------------------------------------------------------------- workers


def ledger(prefix: str) -> list[tuple[str, int | None]]:
    return list(Ledger.objects.filter(label__startswith=prefix).order_by("id")
                .values_list("label", "value"))


@pytest.mark.worker
def test_a_task_runs_on_a_worker_and_its_result_is_complete(start_worker):
    result = djtasks.add.enqueue(2, 3)
    run_burst(start_worker)
    result.refresh()
    assert result.status == SUCCESSFUL and result.is_finished
    assert result.return_value == 5
    assert result.errors == [] and result.attempts == 1
    [attempt] = Attempt.objects.filter(message_id=int(result.id))
    assert result.worker_ids == [attempt.worker_id]
    assert result.enqueued_at <= result.started_at == result.last_attempted_at
    assert result.started_at <= result.finished_at == attempt.finished_at
    assert Ledger.objects.get(label="add:2+3").pid != os.getpid()
    # Django's signals, sent by the worker: started while running, finished after.
    assert ledger("signal:") == [(f"signal:started:{result.id}:RUNNING:-", 1),
                                  (f"signal:finished:{result.id}:SUCCESSFUL:-", 1)]


@pytest.mark.worker
def test_json_return_values_and_non_json_ones(start_worker):
    good = djtasks.record.enqueue("r")
    bad = djtasks.returns_non_json.using(backend="single").enqueue("nj")
    run_burst(start_worker)
    good.refresh()
    bad.refresh()
    assert good.return_value == {"label": "r", "pair": [1, 2]}
    assert bad.status == FAILED
    [error] = bad.errors
    assert error.exception_class is TypeError and "Unsupported type" in error.traceback


@pytest.mark.worker
def test_retries_give_the_context_the_real_attempt_number(start_worker):
    result = djtasks.flaky.enqueue("fl", succeed_on=3)
    run_burst(start_worker)
    result.refresh()
    assert result.status == SUCCESSFUL
    seen = result.return_value
    assert seen["attempt"] == 3 and seen["id"] == result.id
    assert seen["status"] == "RUNNING" and len(seen["worker_ids"]) == 3
    assert seen["errors"] == ["builtins.RuntimeError"] * 2
    assert (seen["args"], seen["backend"], seen["queue_name"]) == (["fl"], "default", "default")
    assert seen["started_at"] < seen["last_attempted_at"]
    assert ledger("fl:") == [("fl:attempt", 1), ("fl:attempt", 2), ("fl:attempt", 3)]
    assert len(result.worker_ids) == 3 and result.attempts == 3
    assert [error.exception_class for error in result.errors] == [RuntimeError] * 2
    assert "fl failed on attempt 1" in result.errors[0].traceback
    assert "fl failed on attempt 2" in result.errors[1].traceback
    assert result.started_at < result.last_attempted_at < result.finished_at


@pytest.mark.worker
def test_a_task_that_always_fails_ends_failed_with_every_error(start_worker):
    result = djtasks.always_fails.enqueue("af")
    output = run_burst(start_worker)
    result.refresh()
    assert result.status == FAILED and result.is_finished
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    assert len(result.errors) == 3 and len(result.worker_ids) == 3
    for error in result.errors:
        assert error.exception_class is ValueError
        assert "Traceback" in error.traceback and "boom af" in error.traceback
    assert result.finished_at is not None
    assert Message.objects.get(pk=int(result.id)).status == "dead"
    # task_finished: READY after a retried attempt, FAILED after the last one, each time
    # sent inside the exception handler (sys.exc_info() is the task's error).
    rid = result.id
    assert ledger("signal:") == [
        (f"signal:started:{rid}:RUNNING:-", 1), (f"signal:finished:{rid}:READY:ValueError", 1),
        (f"signal:started:{rid}:RUNNING:-", 2), (f"signal:finished:{rid}:READY:ValueError", 2),
        (f"signal:started:{rid}:RUNNING:-", 3), (f"signal:finished:{rid}:FAILED:ValueError", 3),
    ]
    # Django's own task logging printed the traceback of the failure.
    assert f"Task id={rid} path=tests.testapp.djtasks.always_fails state=FAILED" in output
    assert "state=FAILED\nTraceback (most recent call last)" in output
    assert "ValueError: boom af" in output


@pytest.mark.worker
def test_a_task_past_its_timeout_under_processes_ends_failed_with_its_signals(start_worker):
    # A --processes child fails the attempt for its timeout and exits: Django's
    # task_finished is sent all the same, READY after the first attempt, FAILED after
    # the last, inside a handler of the TaskTimeout (Django logs its traceback).
    result = djtasks.overruns.enqueue("ov")
    output = run_burst(start_worker, "--processes", "1")
    result.refresh()
    assert result.status == FAILED and result.is_finished, output
    timeout = "django_mysqlq.exceptions.TaskTimeout"
    assert [error.exception_class_path for error in result.errors] == [timeout] * 2
    rid = result.id
    assert ledger("signal:") == [
        (f"signal:started:{rid}:RUNNING:-", 1), (f"signal:finished:{rid}:READY:TaskTimeout", 1),
        (f"signal:started:{rid}:RUNNING:-", 2), (f"signal:finished:{rid}:FAILED:TaskTimeout", 2),
    ], output
    assert f"Task id={rid} path=tests.testapp.djtasks.overruns state=FAILED" in output
    assert "state=FAILED\nTraceback (most recent call last)" in output


@pytest.mark.worker
def test_per_task_and_per_backend_attempts(start_worker):
    once = djtasks.fails_once.enqueue("once")
    twice = djtasks.two_tries.enqueue("twice")
    single = djtasks.always_fails.using(backend="single").enqueue("single")
    run_burst(start_worker)
    for result, attempts, kind in ((once, 1, KeyError), (twice, 2, ValueError),
                                   (single, 1, ValueError)):
        result.refresh()
        assert result.status == FAILED
        assert [error.exception_class for error in result.errors] == [kind] * attempts
    assert single.backend == "single"


@pytest.mark.worker
def test_async_tasks_run(start_worker):
    echo = djtasks.async_echo.enqueue("as")
    with_context = djtasks.async_with_context.enqueue("ab", times=2)
    run_burst(start_worker)
    echo.refresh()
    with_context.refresh()
    assert (echo.status, echo.return_value) == (SUCCESSFUL, "as")
    assert with_context.return_value == {"attempt": 1, "id": with_context.id, "label": "abab"}
    # The coroutine's sync_to_async ORM call ran on the worker's task thread (its own
    # connection), not on a shared executor thread.
    [attempt] = Attempt.objects.filter(message_id=int(echo.id))
    [(label, _)] = ledger("as:")
    assert attempt.thread and label == f"as:{attempt.thread}"


@pytest.mark.worker
def test_system_exit_and_nested_errors_fail_the_task_not_the_worker(start_worker):
    exited = djtasks.exits.enqueue("ex")
    nested = djtasks.nested_error.enqueue("ne")
    after = djtasks.returns_nothing.enqueue("after")
    run_burst(start_worker, "--concurrency", "1", "--batch", "1")
    for result in (exited, nested, after):
        result.refresh()
    assert exited.status == FAILED and exited.finished_at is not None
    [error] = exited.errors
    assert error.exception_class is SystemExit
    assert error.traceback.startswith("Traceback (most recent call last)")
    assert error.traceback.endswith("SystemExit: ex called sys.exit\n")
    [error] = nested.errors
    assert error.exception_class is ValueError
    assert "ValueError: ne inner" in error.traceback
    # The same worker thread went on to the next task; None is a return value too.
    assert after.status == SUCCESSFUL and after.return_value is None
    assert after.started_at >= exited.finished_at


@pytest.mark.worker
def test_a_task_whose_worker_is_killed_runs_again_elsewhere(start_worker):
    result = djtasks.sleepy.enqueue("kill", 3)
    doomed = start_worker()
    wait_for(lambda: Ledger.objects.filter(label="kill:start").exists(), message="kill start")
    # The worker records a start within about a second: only a started attempt is spent.
    wait_for(lambda: Message.objects.filter(pk=int(result.id), started_at__isnull=False)
             .exists(), message="the start to be recorded")
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait()
    run_burst(start_worker)  # recovers the claim of the dead worker, then runs it again
    result.refresh()
    assert result.status == SUCCESSFUL and result.attempts == 2
    first, second = result.worker_ids
    assert first and second and first != second
    [lost] = result.errors
    assert lost.exception_class is WorkerLost
    assert [label for label, _ in ledger("kill:")] == ["kill:start", "kill:start", "kill:end"]


@pytest.mark.worker
def test_run_after_defers_the_task(start_worker):
    run_after = timezone.now() + dt.timedelta(seconds=2)
    result = djtasks.add.using(run_after=run_after).enqueue(7, 7)
    assert Message.objects.get(pk=int(result.id)).status == "scheduled"
    fetched = task_backends["default"].get_result(result.id)
    assert fetched.status == READY and fetched.task.run_after == run_after
    run_burst(start_worker)
    result.refresh()
    assert result.status == SUCCESSFUL
    assert result.started_at >= run_after - dt.timedelta(milliseconds=50)
    assert Ledger.objects.get(label="add:7+7").created_at >= run_after


@pytest.mark.worker
def test_higher_priority_runs_first(start_worker):
    for label, priority in (("p:low", -10), ("p:mid", 0), ("p:high", 50)):
        djtasks.record.using(priority=priority).enqueue(label)
    run_burst(start_worker, "--concurrency", "1", "--batch", "1")
    assert [label for label, _ in ledger("p:")] == ["p:high", "p:mid", "p:low"]


@pytest.mark.worker
def test_queue_name_is_the_queue_workers_serve(start_worker):
    result = djtasks.on_other_queue.enqueue("oq")
    run_burst(start_worker, "--queues", "default")
    result.refresh()
    assert result.status == READY
    run_burst(start_worker, "--queues", "other")
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, "oq")


@pytest.mark.worker
def test_a_running_task_reads_as_running(start_worker):
    result = djtasks.sleepy.enqueue("sl", 1.5)
    worker = start_worker()
    wait_for(lambda: Ledger.objects.filter(label="sl:start").exists(), message="sl start")
    result.refresh()
    assert result.status == RUNNING and not result.is_finished
    assert len(result.worker_ids) == 1 and result.worker_ids[0]
    assert result.started_at == result.last_attempted_at and result.finished_at is None

    def done():
        result.refresh()
        return result.is_finished

    wait_for(done, message="sl to finish")
    assert result.status == SUCCESSFUL
    worker.signal(15)
    worker.wait()


@pytest.mark.parametrize("started", [True, False])
def test_a_lost_attempt_reads_as_ready_with_a_worker_lost_error(started):
    result = djtasks.add.enqueue(1, 0)
    [claimed] = broker.claim(["default"], 1, "gone-worker", lease_seconds=0.0)
    assert str(claimed.id) == result.id
    if started:
        broker.mark_started([(claimed, timezone.now())])
    assert task_backends["default"].get_result(result.id).status == RUNNING
    time.sleep(0.01)
    assert broker.recover(liveness="lease") == [claimed.id]
    result.refresh()
    # A claim lost before it started is no attempt: it spent none.
    assert result.status == READY
    assert result.worker_ids == (["gone-worker"] if started else [])
    [error] = result.errors
    assert error.exception_class is WorkerLost and "lease expired" in error.traceback


# --------------------------------------------------------------------------- only tasks run


@pytest.mark.worker
def test_only_django_tasks_of_this_backend_run(start_worker, tmp_path):
    marker = tmp_path / "marker"
    names = [
        ("os.system", [f"touch {marker}"]),
        ("builtins.eval", [f"open({str(marker)!r}, 'w')"]),
        ("tests.testapp.import_side_effect.run", []),           # never imported
        ("tests.testapp.djtasks.plain_function", ["plain"]),     # not a task
        ("tests.testapp.djtasks.immediate_only", ["immediate"]),  # sent to another backend
        ("tests.testapp.djtasks.alias_of_add", [1, 2]),          # not its own path
        ("tests.testapp.djtasks.Ledger.objects", []),
        ("", []),
        ("os", []),
    ]
    ids_by_name = {}
    for path, args in names:
        [message_id] = broker.enqueue([NewMessage(
            task_name=f"django.tasks:{path}", queue="default", priority=0,
            payload=json.dumps({"args": args, "kwargs": {}, "backend": "immediate"
                                if path.endswith("immediate_only") else "default"}),
            run_at=None, delay=0.0, max_attempts=3, retry_backoff=0.0, timeout=None,
            dedup_key=None)])
        ids_by_name[path] = message_id
    # A name no worker resolves is given back for later (a rolling deploy may bring it:
    # tests/test_deploys.py); these are on their last deferral, so they go dead.
    Message.objects.filter(pk__in=ids_by_name.values()).update(deferrals=12)
    run_burst(start_worker, env={"MYSQLQ_TEST_IMPORT_MARKER": str(marker)})

    assert not marker.exists()
    assert not Ledger.objects.exists()
    for path, message_id in ids_by_name.items():
        message = Message.objects.get(pk=message_id)
        # Found at resolve time: dead at once. A real task whose message names a backend
        # that isn't this queue is refused when its attempt starts, so it uses its
        # attempts (never running the function).
        attempts = 3 if path.endswith("immediate_only") else 1
        assert (message.status, message.attempts) == ("dead", attempts), path
        assert message.last_error.startswith("django_mysqlq.exceptions.UnknownTask"), path
    assert "ImmediateBackend" in Message.objects.get(
        pk=ids_by_name["tests.testapp.djtasks.immediate_only"]).last_error
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(ids_by_name["os.system"]))


@pytest.mark.worker
def test_a_task_of_another_backend_sent_here_with_using_runs_here(start_worker):
    result = djtasks.immediate_only.using(backend="default").enqueue("moved")
    assert result.backend == "default"
    run_burst(start_worker)
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, None)
    fetched = task_backends["default"].get_result(result.id)
    assert fetched.task.func is djtasks.immediate_only.func
    assert fetched.task.backend == "default"
    assert Ledger.objects.get(label="moved").pid != os.getpid()


def test_a_django_task_queue_on_another_database_is_refused(settings):
    """Its result reads, its task_enqueued hook and a worker's reading of its attempts
    go to MYSQLQ['DATABASE']: written on another database, get_result found nothing (or
    another message with the same id)."""
    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {"other": {"DATABASE": "elsewhere"}}}
    [placed] = [m for m in task_backends["default"].check() if m.id == "django_mysqlq.E107"]
    assert "'other'" in placed.msg and "'elsewhere'" in placed.msg
    with pytest.raises(InvalidTask, match=r"Queue 'other' is placed on 'elsewhere'"):
        djtasks.add.using(queue_name="other").enqueue(1, 2)
    assert not Message.objects.exists()
    djtasks.add.enqueue(1, 2)  # 'default' stays where it was


def test_a_task_bound_to_another_name_than_its_function_is_refused_at_enqueue():
    """A worker looks a task up by its function's module and name: ``renamed =
    task(_renamed)`` is not found there, and each message went dead as an unknown task
    (while immediate mode ran it, so the tests passed)."""
    with pytest.raises(InvalidTask, match=r"'tests\.testapp\.djtasks\._renamed' is not at "
                                          r"that path"):
        djtasks.renamed.enqueue("renamed")
    assert not Message.objects.exists()


def test_enqueue_has_an_enqueued_at_even_when_a_worker_acked_the_message_first(monkeypatch):
    """In autocommit the enqueue commits and wakes the workers before the backend reads
    the row back: a fast task could be run and acked (its row deleted) first, and the
    TaskResult came back with enqueued_at None."""
    from django_mysqlq import testing

    real = broker.enqueue

    def enqueue_then_run(messages, *args, **kwargs):
        ids = real(messages, *args, **kwargs)
        testing.drain()  # a worker woken by the commit, faster than the read-back
        return ids

    monkeypatch.setattr(broker, "enqueue", enqueue_then_run)
    result = djtasks.add.enqueue(2, 3)
    assert not Message.objects.filter(pk=int(result.id)).exists()
    assert result.enqueued_at is not None
    assert result.enqueued_at == Attempt.objects.get(message_id=int(result.id)).enqueued_at
