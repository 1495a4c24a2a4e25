"""The operator commands work while the task code is broken (a schedule E006 or a task
module E005 can't be written or imported): they run only the checks of the settings and
of where the queues live, which still stop them on a configuration nothing can use."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_mysqlq.models import Schedule

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent

GOOD = {"task": "tests.testapp.tasks.record", "cron": "0 3 * * *", "args": ["nightly"]}
BAD = {"task": "shop.tasks.nope", "cron": "0 3 * * *"}


def with_mysqlq(**entries: object) -> override_settings:
    return override_settings(MYSQLQ={**settings.MYSQLQ, **entries})


def run(*args: str) -> tuple[str, str]:
    """The command as ``manage.py`` runs it: with the system checks (``call_command``
    skips them unless told)."""
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, skip_checks=False)
    return out.getvalue(), err.getvalue()


def test_a_broken_schedule_blocks_no_operator_command():
    with with_mysqlq(SCHEDULES={"bad": BAD, "good": GOOD}):
        out, err = run("queueschedule")
        assert "Declared schedule not written: MYSQLQ['SCHEDULES']['bad'] names the task " \
               "'shop.tasks.nope', which is not registered" in err
        assert any(line.startswith("good ") for line in out.splitlines())
        assert Schedule.objects.filter(name="good").exists()
        assert not Schedule.objects.filter(name="bad").exists()
        out, err = run("queueschedule", "pause", "good")
        assert out.strip() == "Paused: good."
        assert "queue" in run("queuestats")[0].splitlines()[0]
        assert run("queuepause", "emails")[0].startswith("Paused emails.")
        assert run("queuepause", "emails", "--resume")[0].startswith("Resumed emails.")
        assert run("queuerequeue", "--dry-run")[0].strip() == \
            "0 message(s) would be requeued."
        assert run("queuecancel", "--status", "dead", "--dry-run")[0].strip() == \
            "0 message(s) would be cancelled."
        run("queuehistory", "partitions")
        run("queuepurge", "--older-than", "30d", "--dry-run")
        run("queuesubject", "show", "k")
        run("queuetopic", "groups")


def test_a_task_module_that_fails_to_import_blocks_no_operator_command():
    with with_mysqlq(TASK_MODULES=["tests.no_such_module"], SCHEDULES={"good": GOOD}):
        _, err = run("queueschedule")
        said = "Declared schedule not written: none is written until every task module imports: "
        assert f"{said}Could not import the task module 'tests.no_such_module'" in err
        assert not Schedule.objects.filter(name="good").exists()  # not even the good one
        # docs/settings.md says so (it said the others were written, as for an E006).
        docs = " ".join((ROOT / "docs" / "settings.md").read_text().split())
        assert f"(E005) it writes none, and says so on stderr (`{said}…`)" in docs
        assert run("queuepause", "emails")[0].startswith("Paused emails.")
        assert "queue" in run("queuestats")[0].splitlines()[0]


def test_the_worker_still_refuses_a_broken_schedule():
    with with_mysqlq(SCHEDULES={"bad": BAD}), \
            pytest.raises(SystemCheckError, match=r"django_mysqlq\.E006"):
        run("runqueueworker", "--burst")


def test_a_configuration_nothing_can_use_still_stops_them():
    with with_mysqlq(DATABASE="nosuch"):
        with pytest.raises(SystemCheckError, match=r"django_mysqlq\.E002.*'nosuch'"):
            run("queuestats")
        with pytest.raises(SystemCheckError, match=r"django_mysqlq\.E002"):
            run("queuepause", "emails")
    with override_settings(MYSQLQ={**settings.MYSQLQ, "POLL_SECONDS": "soon"}):
        with pytest.raises(SystemCheckError, match=r"django_mysqlq\.E001"):
            run("queuestats")
        # Without the checks (call_command's default), still a one-line error.
        with pytest.raises(CommandError, match=r"^MYSQLQ is invalid: .*POLL_SECONDS"):
            call_command("queuepause", "emails", stdout=io.StringIO())


def test_skip_checks_is_still_accepted():
    with with_mysqlq(SCHEDULES={"bad": BAD}):
        out = io.StringIO()
        call_command("queuepause", "emails", "--skip-checks", stdout=out)
        assert out.getvalue().startswith("Paused emails.")
