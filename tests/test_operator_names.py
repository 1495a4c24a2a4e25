"""The operator commands' warnings for a name nothing uses: a queue (``queuepause emial``)
and a ``--task`` with no message (a Django ``@task`` given without ``django.tasks:``)."""

from __future__ import annotations

import io

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from django_mysqlq import broker, ops
from tests.operator_support import make_dead
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_pausing_a_queue_nothing_uses_warns_and_pauses_anyway():
    out, err = run("queuepause", "emial")
    assert err.strip() == "no message, worker or task uses queue 'emial': a typo? Paused anyway."
    assert out.startswith("Paused emial.\n")
    assert "emial" in broker.paused_queues()
    out, err = run("queuepause", "emial", "--resume")  # paused: a name in use
    assert (out.splitlines()[0], err) == ("Resumed emial.", "")
    out, err = run("queuepause", "emial", "--resume")
    assert err.strip() == "no message, worker or task uses queue 'emial': a typo? " \
                          "Resumed anyway."


def test_a_queue_some_task_setting_or_message_uses_is_paused_without_a_word():
    assert run("queuepause", "default")[1] == ""  # MYSQLQ['DEFAULT_QUEUE']
    assert run("queuepause", "other")[1] == ""  # a @queue_task's
    with override_settings(MYSQLQ={**settings.MYSQLQ, "QUEUES": {"reports": {}}}):
        assert run("queuepause", "reports")[1] == ""
    tasks.record.using(queue="adhoc").enqueue("x")
    assert run("queuepause", "adhoc")[1] == ""
    broker.set_paused("adhoc", False, ops.cli_operator())


def test_requeue_and_cancel_warn_of_a_queue_nothing_uses():
    make_dead()
    out, err = run("queuerequeue", "--queue", "emial", "--dry-run")
    assert out.strip() == "0 message(s) would be requeued."
    assert err.strip() == "no message, worker or task uses queue 'emial': a typo?"
    _, err = run("queuecancel", "--status", "dead", "--queue", "emial", "--dry-run")
    assert err.strip() == "no message, worker or task uses queue 'emial': a typo?"
    assert run("queuerequeue", "--queue", "default", "--dry-run")[1] == ""


def test_a_task_with_no_message_is_said():
    make_dead()
    _, err = run("queuerequeue", "--task", "shop.tasks.nope", "--dry-run")
    assert err.strip() == "no message of task 'shop.tasks.nope': a typo?"
    _, err = run("queuerequeue", "--task", "tests.testapp.tasks.record", "--dry-run")
    assert err.strip() == "no message of task 'tests.testapp.tasks.record'."
    out, err = run("queuerequeue", "--task", "tests.testapp.tasks.always_fails", "--dry-run")
    assert (out.strip(), err) == ("1 message(s) would be requeued.", "")


def test_a_django_task_given_by_its_path_names_its_stored_name():
    pytest.importorskip("django_mysqlq.backend.compat",
                        reason="needs django.tasks (Django 6) or django-tasks")
    from tests.testapp import djtasks

    djtasks.add.enqueue(1, 2)
    stored = "django.tasks:tests.testapp.djtasks.add"
    out, err = run("queuecancel", "--status", "ready", "--task", "tests.testapp.djtasks.add",
                   "--dry-run")
    assert out.strip() == "0 message(s) would be cancelled."
    assert err.strip() == (f"no message of task 'tests.testapp.djtasks.add'; did you mean "
                           f"{stored}? (Django @task messages are stored under that name)")
    _, err = run("queuerequeue", "--status", "ready", "--task", "tests.testapp.djtasks.add",
                 "--dry-run")
    assert f"did you mean {stored}?" in err
    out, err = run("queuecancel", "--status", "ready", "--task", stored, "--dry-run")
    assert (out.strip(), err) == ("1 message(s) would be cancelled.", "")
    # A Django task with no message yet is found by its path too.
    _, err = run("queuerequeue", "--task", "tests.testapp.djtasks.record", "--dry-run")
    assert "did you mean django.tasks:tests.testapp.djtasks.record?" in err


def test_a_django_task_given_by_its_stored_name_with_no_message_is_no_typo():
    # Its prefixed name is right: no "a typo?", as its unprefixed path points to it.
    pytest.importorskip("django_mysqlq.backend.compat",
                        reason="needs django.tasks (Django 6) or django-tasks")
    stored = "django.tasks:tests.testapp.djtasks.record"
    for command in (["queuerequeue"], ["queuecancel", "--status", "dead"]):
        _, err = run(*command, "--task", stored, "--dry-run")
        assert err.strip() == f"no message of task {stored!r}.", command
    _, err = run("queuerequeue", "--task", "django.tasks:tests.testapp.djtasks.nope",
                 "--dry-run")
    assert err.strip() == "no message of task 'django.tasks:tests.testapp.djtasks.nope': " \
                          "a typo?"
