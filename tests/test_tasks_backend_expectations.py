"""MySQLQueueBackend meets what Django's Tasks framework leads users to expect: one attempt
unless told otherwise, a task no worker can find refused at enqueue, calls checked against
the function, and the test mode (MYSQLQ['IMMEDIATE']) with results and signals.

Task functions: tests/testapp/djtasks.py (and djjobs.py, djmodule.py, djstray.py).
"""

from __future__ import annotations

import pytest
from django.db import transaction

compat = pytest.importorskip("django_mysqlq.backend.compat",
                             reason="needs django.tasks (Django 6) or django-tasks")

from django_mysqlq import TaskArgumentError  # noqa: E402
from django_mysqlq.backend import MySQLQueueBackend  # noqa: E402
from django_mysqlq.backend import immediate as backend_immediate  # noqa: E402
from django_mysqlq.models import Attempt, Message  # noqa: E402
from django_mysqlq.testing import immediate  # noqa: E402
from tests.test_tasks_backend import run_burst  # noqa: E402
from tests.testapp import djjobs, djmodule, djstray, djtasks  # noqa: E402
from tests.testapp.models import Ledger  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.compat]

InvalidTask = compat.InvalidTask
TaskResultDoesNotExist = compat.TaskResultDoesNotExist
TaskResultStatus = compat.TaskResultStatus
task_backends = compat.task_backends
READY, SUCCESSFUL, FAILED = (TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL,
                             TaskResultStatus.FAILED)


def stored_attempts(result) -> int:
    return Message.objects.get(pk=int(result.id)).max_attempts


# --------------------------------------------------------------------------- one attempt


def test_without_options_a_task_runs_once_whatever_max_attempts_says(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_ATTEMPTS": 7}  # @queue_task's default only
    assert stored_attempts(djtasks.add.using(backend="plain").enqueue(1, 1)) == 1
    assert stored_attempts(djtasks.two_tries.using(backend="plain").enqueue("t")) == 2
    assert stored_attempts(djtasks.add.enqueue(1, 1)) == 3  # the backend's OPTIONS


@pytest.mark.worker
def test_a_failing_task_of_a_backend_without_options_is_not_retried(start_worker):
    result = djtasks.always_fails.using(backend="plain").enqueue("plain-once")
    run_burst(start_worker)
    result.refresh()
    assert result.status == FAILED and len(result.errors) == 1
    assert Ledger.objects.filter(label="plain-once").count() == 1


# --------------------------------------------------------------------------- reachability


def test_a_task_no_worker_imports_is_refused_at_enqueue_with_the_fix(settings):
    with pytest.raises(InvalidTask) as caught:
        djstray.lost.enqueue("x")
    assert str(caught.value) == (
        "The task 'tests.testapp.djstray.lost' is defined in the module "
        "'tests.testapp.djstray', which workers never import: it is not an installed app's "
        "tasks module, not in MYSQLQ['TASK_MODULES'], and no such module imports it. Its "
        "messages would go dead on the worker as an unknown task. Add "
        "'tests.testapp.djstray' to MYSQLQ['TASK_MODULES'], or move the task into an app's "
        "tasks.py.")
    assert not Message.objects.exists()
    settings.MYSQLQ = {**settings.MYSQLQ, "TASK_MODULES": [
        *settings.MYSQLQ["TASK_MODULES"], "tests.testapp.djstray"]}
    assert djstray.lost.enqueue("x").status == READY


def test_the_immediate_mode_refuses_it_too():
    with immediate(), pytest.raises(InvalidTask, match="workers never import"):
        djstray.lost.enqueue("x")


@pytest.mark.worker
def test_tasks_a_task_module_imports_are_accepted_and_do_run(start_worker):
    by_name = djjobs.job.enqueue("through-djtasks")
    by_module = djmodule.shout.enqueue("module")
    run_burst(start_worker)
    by_name.refresh()
    by_module.refresh()
    assert (by_name.status, by_name.return_value) == (SUCCESSFUL, "through-djtasks")
    assert (by_module.status, by_module.return_value) == (SUCCESSFUL, "MODULE")


# --------------------------------------------------------------------------- signatures


def test_a_call_that_does_not_fit_the_function_raises_at_once():
    with pytest.raises(TaskArgumentError) as caught:
        djtasks.add.enqueue(1)
    assert str(caught.value) == (
        "Task 'tests.testapp.djtasks.add' can't be called with these arguments: missing a "
        "required argument: 'b'. It takes (a, b); nothing was enqueued.")
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        djtasks.add.enqueue(1, 2, c=3)
    # takes_context: the context is Django's to pass, not the caller's.
    with pytest.raises(TaskArgumentError, match=r"missing a required argument: 'succeed_on'. "
                                                r"It takes \(label, succeed_on\)"):
        djtasks.flaky.enqueue("x")
    with pytest.raises(TaskArgumentError, match="unexpected keyword argument 'time'"):
        djtasks.async_with_context.enqueue("x", time=2)
    assert not Message.objects.exists()
    djtasks.flaky.enqueue("x", 1)
    djtasks.async_with_context.enqueue("x", times=2)
    assert Message.objects.count() == 2


# --------------------------------------------------------------------------- the test mode


@pytest.fixture
def signals():
    seen = []

    def receiver(signal_name):
        def receive(sender, task_result, **kwargs):
            seen.append((signal_name, sender, task_result.id, task_result.status))
        return receive

    receivers = [(getattr(compat, name), receiver(name))
                 for name in ("task_enqueued", "task_started", "task_finished")]
    for signal, receive in receivers:
        signal.connect(receive)
    yield seen
    for signal, receive in receivers:
        signal.disconnect(receive)


def test_immediate_runs_the_task_after_commit_with_djangos_signals(signals):
    with immediate():
        with transaction.atomic():
            result = djtasks.add.enqueue(2, 3)
            assert result.status == READY and signals == []
        assert result.status == SUCCESSFUL and result.return_value == 5
        assert result.attempts == 1 and result.errors == []
        assert result.enqueued_at <= result.started_at <= result.finished_at
        assert signals == [("task_enqueued", MySQLQueueBackend, result.id, READY),
                           ("task_started", MySQLQueueBackend, result.id,
                            TaskResultStatus.RUNNING),
                           ("task_finished", MySQLQueueBackend, result.id, SUCCESSFUL)]
        fetched = task_backends["default"].get_result(result.id)
        assert fetched.status == SUCCESSFUL and fetched.return_value == 5
        assert djtasks.add.get_result(result.id).id == result.id
        result.refresh()
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["single"].get_result(result.id)
    assert not Message.objects.exists() and not Attempt.objects.exists()
    assert Ledger.objects.filter(label="add:2+3").count() == 1


def test_immediate_gives_the_context_and_normalizes_arguments():
    with immediate():
        result = djtasks.flaky.enqueue("ctx", 1)
        assert result.status == SUCCESSFUL
        assert result.return_value["attempt"] == 1
        assert result.return_value["id"] == result.id
        assert result.return_value["backend"] == "default"
        echoed = djtasks.async_echo.enqueue(("a", ("b",)))  # an async task, too
        assert echoed.args == [["a", ["b"]]]
        assert echoed.return_value == ["a", ["b"]]  # what the function got: lists
        assert djtasks.record.enqueue("n").return_value == {"label": "n", "pair": [1, 2]}


def test_immediate_raises_a_tasks_exception_in_the_caller_by_default():
    with immediate(), pytest.raises(ValueError, match="boom x"):
        djtasks.always_fails.enqueue("x")
    assert Ledger.objects.filter(label="x").count() == 1  # once, never retried


def test_immediate_raise_false_gives_a_failed_result_like_djangos_immediate_backend():
    with immediate(raise_errors=False):
        result = djtasks.always_fails.enqueue("quiet")
        assert result.status == FAILED
        [error] = result.errors
        assert error.exception_class is ValueError and "boom quiet" in error.traceback
        assert task_backends["default"].get_result(result.id).status == FAILED
        bad = djtasks.returns_non_json.enqueue("nj")
        assert bad.status == FAILED and bad.errors[0].exception_class is TypeError


def test_immediate_results_read_while_the_commit_hooks_run_are_not_rolled_back():
    """During the commit's hooks a result not run yet is READY (committed), as on a worker;
    one running says RUNNING."""
    seen: list[tuple[str, str]] = []

    def on_enqueued(sender, task_result, **kwargs):
        task_result.refresh()
        seen.append(("enqueued", str(task_result.status)))

    later: dict[str, str] = {}
    compat.task_enqueued.connect(on_enqueued)
    try:
        with immediate(), transaction.atomic():
            transaction.on_commit(lambda: seen.append(
                ("hook", str(task_backends["default"].get_result(later["id"]).status))))
            reader = djtasks.reads_results.enqueue("other-id")
            added = djtasks.add.enqueue(1, 2)
            later["id"] = reader.id
            Ledger.objects.create(label="other-id", value=int(added.id), pid=0)
    finally:
        compat.task_enqueued.disconnect(on_enqueued)
    assert seen == [("hook", READY), ("enqueued", READY), ("enqueued", READY)]
    assert reader.status == SUCCESSFUL, reader.errors
    assert reader.return_value == {"own": TaskResultStatus.RUNNING, "other": READY}
    assert added.status == SUCCESSFUL


def test_immediate_results_of_a_rolled_back_transaction_do_not_exist():
    with immediate():
        with transaction.atomic():
            result = djtasks.add.enqueue(1, 1)
            assert task_backends["default"].get_result(result.id).status == READY
            transaction.set_rollback(True)
        assert result.status == READY  # never ran
        with pytest.raises(TaskResultDoesNotExist, match="rolled back"):
            task_backends["default"].get_result(result.id)
        assert not Ledger.objects.exists()


def test_immediate_keeps_a_bounded_number_of_results(monkeypatch):
    monkeypatch.setattr(backend_immediate, "KEEP_RESULTS", 2)
    with immediate():
        first, *_ = [djtasks.timed.enqueue(n) for n in range(3)]
        with pytest.raises(TaskResultDoesNotExist, match="in this process"):
            task_backends["default"].get_result(first.id)


# --------------------------------------------------------------------------- return values

#: Each kind of return value history can't keep as it is, and the error that fails it.
UNSTORABLE_ERRORS = {"nan": (ValueError, "isn't JSON the queue can store"),
                     "int_key": (TypeError, "dict key that isn't a string (1)"),
                     "surrogate": (ValueError, "lone surrogate"),
                     "huge_int": (ValueError, "too large for a double")}


def assert_failed_as_unstorable(result, kind: str) -> None:
    kind_class, text = UNSTORABLE_ERRORS[kind]
    assert result.status == FAILED, (kind, result.status, result.return_value)
    [error] = result.errors
    assert issubclass(error.exception_class, kind_class) and text in error.traceback, \
        (kind, error.traceback)


@pytest.mark.worker
def test_a_return_value_history_cannot_keep_fails_the_attempt_on_a_worker(start_worker):
    results = {kind: djtasks.returns_unstorable.using(backend="single").enqueue(kind)
               for kind in UNSTORABLE_ERRORS}
    run_burst(start_worker)
    for kind, result in results.items():
        result.refresh()
        assert_failed_as_unstorable(result, kind)


def test_a_return_value_history_cannot_keep_fails_the_attempt_in_the_test_mode():
    with immediate(raise_errors=False):
        for kind in UNSTORABLE_ERRORS:
            assert_failed_as_unstorable(djtasks.returns_unstorable.enqueue(kind), kind)


# --------------------------------------------------------------------------- cancelled


def test_a_cancelled_task_reads_failed_with_an_error_naming_who_cancelled_it():
    """Django's TaskResultStatus has no CANCELLED: FAILED, and ``errors`` says so."""
    import io

    from django.core.management import call_command

    from django_mysqlq import broker
    from django_mysqlq.backend import TaskCancelled
    from django_mysqlq.messages import AttemptResult
    from django_mysqlq.ops import cli_operator
    from tests.operator_support import RUNNER

    assert not hasattr(TaskResultStatus, "CANCELLED")  # else map cancelled to it
    result = djtasks.add.enqueue(1, 2)
    call_command("queuecancel", "--status", "ready", "--task",
                 "django.tasks:tests.testapp.djtasks.add", stdout=io.StringIO())
    result.refresh()
    assert result.status == FAILED and result.finished_at is not None
    [error] = result.errors
    assert error.exception_class is TaskCancelled
    assert error.traceback == (f"django_mysqlq.backend.results.TaskCancelled: cancelled by "
                               f"{cli_operator().name}")

    dead = djtasks.add.enqueue(3, 4)
    [message] = broker.claim(["default"], 1, RUNNER.worker_id, lease_seconds=30)
    broker.fail(message, RUNNER, AttemptResult(started_at=broker.database_now(),
                                               error_class="ValueError", error_message="no"),
                retry=False)
    broker.purge_dead_batch(broker.database_now(), 10, cli_operator())
    dead.refresh()
    assert dead.status == FAILED
    assert [e.exception_class_path for e in dead.errors] == [
        "ValueError", "django_mysqlq.backend.results.TaskCancelled"]
    assert dead.errors[-1].traceback.endswith(
        f"cancelled by {cli_operator().name} (dead message purged)")
