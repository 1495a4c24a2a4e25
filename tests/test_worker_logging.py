"""What a worker logs: one line per finished attempt, each line once, text or JSON.

Real ``runqueueworker --burst`` processes under the project logging setups a user has:
the suite's own ``LOGGING`` (a handler on ``django_mysqlq``), none at all (Django's
defaults, ``MYSQLQ_TEST_LOGGING=django-default``) and a handler on the root logger only
(``MYSQLQ_TEST_LOGGING=root``); see tests/settings.py.
"""

from __future__ import annotations

import json
import logging

import pytest
from django.test import override_settings

from django_mysqlq.backend.compat import FRAMEWORK
from django_mysqlq.conf import SettingsError, load_settings
from django_mysqlq.log import JSONFormatter, one_line
from django_mysqlq.models import Attempt
from tests.burst import run_burst
from tests.testapp import djtasks, tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker,
              pytest.mark.compat]

DJANGO_DEFAULT = {"MYSQLQ_TEST_LOGGING": "django-default"}


def lines_of(output: str, *parts: str) -> list[str]:
    return [line for line in output.splitlines() if all(part in line for part in parts)]


def records(output: str) -> list[dict]:
    """The JSON log records in a worker's output (not its JSON summary)."""
    return [json.loads(line) for line in output.splitlines()
            if line.startswith("{") and '"logger"' in line]


# --------------------------------------------------------------------------- the attempt line


def test_every_finished_attempt_logs_one_line_with_its_outcome(start_worker):
    ok = tasks.record.enqueue("ok").id
    failing = tasks.always_fails.enqueue("f").id  # retried, retried, dead
    _, output = run_burst(start_worker, "--exit-zero")
    [success] = lines_of(output, f"id={ok} ")
    assert success.startswith(f"task=tests.testapp.tasks.record id={ok} queue=default "
                              "attempt=1/3 outcome=succeeded duration_ms=")
    attempts = lines_of(output, f"id={failing} ")
    assert [line.split(" outcome=")[1].split()[0] for line in attempts] == [
        "retried", "retried", "failed"]
    assert all("error=ValueError: boom f" in line for line in attempts)
    assert "attempt=3/3 outcome=failed" in attempts[2]
    assert attempts[2].endswith("detail=now dead: no attempts left")
    # The death, and only the death, carries its traceback, once.
    assert output.count("Traceback (most recent call last)") == 1
    assert output.index(attempts[2]) < output.index("Traceback (most recent call last)")
    # No second line about the same attempts (the old WARNING/ERROR lines).
    assert "will retry" not in output and "failed on its last attempt" not in output


def test_a_long_error_is_cut_to_one_line_and_history_keeps_it_whole(start_worker):
    handle = tasks.fails_verbosely.enqueue(3000)
    _, output = run_burst(start_worker, "--exit-zero")
    [line] = lines_of(output, f"id={handle.id} ", "outcome=failed")
    error = line.split(" error=", 1)[1].split(" detail=")[0]
    assert error.startswith("ValueError: first line\\nsecond line xxx")
    assert error.endswith("… (cut from 3,024 characters)")
    assert len(error) < 600
    attempt = Attempt.objects.get(message_id=handle.id)
    assert attempt.error_message == "first line\nsecond line " + "x" * 3000
    # The traceback in the log cuts its long line too; history keeps the whole text.
    assert max(len(text) for text in output.splitlines()) < 700
    assert "x" * 3000 in attempt.traceback


def test_batched_successes_are_logged_once_each_after_their_ack(start_worker):
    handles = tasks.record.enqueue_many([[f"b{i}"] for i in range(30)])
    counts, output = run_burst(start_worker, "--concurrency", "4",
                               env={"MYSQLQ_TEST_ACK_BATCH": "10", "MYSQLQ_TEST_ACK_DELAY": "0.2"})
    assert counts["succeeded"] == 30
    for handle in handles:
        assert len(lines_of(output, f" id={handle.id} ", "outcome=succeeded")) == 1


# --------------------------------------------------------------------------- each line once


def test_a_django_task_logs_each_line_once_under_djangos_default_logging(start_worker):
    """No LOGGING, DEBUG on: Django's own console handler prints django.tasks records; a
    handler on the root logger (logging.basicConfig) printed each a second time."""
    result = djtasks.add.enqueue(2, 3)
    _, output = run_burst(start_worker,
                          env={**DJANGO_DEFAULT, "MYSQLQ_TEST_DEBUG": "1"})
    path = "path=tests.testapp.djtasks.add"
    # Django 6's django.tasks logger is under "django", whose console handler shows it with
    # DEBUG on; the backport's django_tasks logger has no handler by default.
    shown = 1 if FRAMEWORK == "django.tasks" else 0
    assert len(lines_of(output, f"Task id={result.id} {path} state=RUNNING")) == shown, output
    assert len(lines_of(output, f"Task id={result.id} {path} state=SUCCESSFUL")) == shown, \
        output
    assert len(lines_of(output, f" id={result.id} ", "outcome=succeeded")) == 1, output
    assert len(lines_of(output, " started: queues=")) == 1


def test_a_django_task_logs_each_line_once_when_logging_has_a_root_handler(start_worker):
    done = djtasks.add.enqueue(1, 1)
    dead = djtasks.fails_once.enqueue("gone")
    _, output = run_burst(start_worker, "--exit-zero", env={"MYSQLQ_TEST_LOGGING": "root"})
    for result, state in ((done, "SUCCESSFUL"), (dead, "FAILED")):
        assert len(lines_of(output, f"Task id={result.id} ", f"state={state}")) == 1, output
        assert len(lines_of(output, f" id={result.id} ", "outcome=")) == 1, output
    # Django logs the failed task's traceback (django.tasks); the worker's line doesn't repeat it.
    assert output.count("Traceback (most recent call last)") == 1, output
    assert "KeyError: 'gone'" in output


@pytest.mark.parametrize("batch", ["20", "1"], ids=["acker", "task-threads"])
def test_a_logging_handler_that_raises_ends_no_thread_and_loses_no_ack(start_worker,
                                                                        batch):
    """An attempt line is written by the acker (batched successes) or a task thread.
    A project handler raising from ``emit`` ended that thread: the acker's successes
    stayed claimed (renewed) for good and the --burst worker never ended; a task thread
    left its message in flight."""
    good = tasks.record.enqueue_many([tasks.record.call(f"ok{i}") for i in range(30)])
    bad = tasks.always_fails.enqueue("bad")
    summary, output = run_burst(start_worker, "--concurrency", "2", env={
        "MYSQLQ_TEST_LOGGING": "raising", "MYSQLQ_TEST_ACK_BATCH": batch})
    assert summary["succeeded"] == 30 and summary["dead"] == 1, output[-3000:]
    assert Attempt.objects.filter(message_id__in=[h.id for h in good],
                                  outcome="succeeded").count() == 30
    assert Attempt.objects.filter(message_id=bad.id, outcome="failed").exists()
    assert ("django_mysqlq: a logging handler raised ConnectionError: the log webhook is "
            "down (that log line is lost; the worker goes on)") in output


def test_verbosity_zero_keeps_warnings_and_drops_successes(start_worker):
    ok = tasks.record.enqueue("quiet").id
    failing = tasks.fails_verbosely.enqueue(10).id
    _, output = run_burst(start_worker, "-v", "0", "--exit-zero", env=DJANGO_DEFAULT)
    assert not lines_of(output, f" id={ok} ")
    assert len(lines_of(output, f"id={failing} ", "ERROR django_mysqlq.attempts:")) == 1


# --------------------------------------------------------------------------- JSON


def test_log_format_json_writes_one_object_per_line_with_the_attempt_fields(start_worker):
    ok = tasks.record.enqueue("j").id
    dead = tasks.fails_verbosely.enqueue(1000).id
    _, output = run_burst(start_worker, "--log-format", "json", "--exit-zero",
                          env=DJANGO_DEFAULT)
    logged = records(output)
    assert logged and all(set(r) >= {"time", "level", "logger", "message"} for r in logged)
    assert not [line for line in output.splitlines()
                if line and not line.startswith(("{", "Summary:"))], output
    [success] = [r for r in logged if r.get("message_id") == ok]
    assert success["logger"] == "django_mysqlq.attempts"
    assert success["level"] == "INFO"
    assert success["time"].endswith("Z")
    assert {k: success[k] for k in ("task", "queue", "attempt", "max_attempts", "outcome")} == {
        "task": "tests.testapp.tasks.record", "queue": "default", "attempt": 1,
        "max_attempts": 3, "outcome": "succeeded"}
    assert isinstance(success["duration_ms"], float)
    assert "error_class" not in success
    [death] = [r for r in logged if r.get("message_id") == dead]
    assert death["level"] == "ERROR" and death["outcome"] == "failed"
    assert death["error_class"] == "builtins.ValueError"
    assert death["error"].startswith("first line\\nsecond line xx")
    assert len(death["error"]) < 600
    assert death["traceback"].startswith("Traceback (most recent call last)")
    assert death["message"].startswith(f"task=tests.testapp.tasks.fails_verbosely id={dead} ")
    assert any(r["message"].startswith("Worker ") and " started: " in r["message"]
               for r in logged)


def test_the_log_format_setting_gives_json_too(start_worker):
    tasks.record.enqueue("s")
    _, output = run_burst(start_worker, env={**DJANGO_DEFAULT,
                                             "MYSQLQ_TEST_LOG_FORMAT": "json"})
    assert [r["outcome"] for r in records(output) if "outcome" in r] == ["succeeded"]


def test_json_asked_for_under_the_projects_own_handlers_says_they_are_kept(start_worker):
    handle = tasks.record.enqueue("kept")
    _, output = run_burst(start_worker, "--log-format", "json")  # the suite's LOGGING
    assert "but LOGGING already gives the django_mysqlq logger handlers" in output
    assert "django_mysqlq.log.JSONFormatter" in output
    assert lines_of(output, f"task=tests.testapp.tasks.record id={handle.id} ")
    assert not records(output)


def test_the_json_formatter_is_usable_in_a_projects_own_logging():
    record = logging.LogRecord("shop", logging.WARNING, __file__, 1, "low stock: %s", ("pens",),
                               None)
    record.sku = 42
    entry = json.loads(JSONFormatter().format(record))
    assert entry["message"] == "low stock: pens"
    assert entry["level"] == "WARNING" and entry["logger"] == "shop" and entry["sku"] == 42
    try:
        raise KeyError("x")
    except KeyError:
        import sys

        failed = logging.LogRecord("shop", logging.ERROR, __file__, 1, "oops", (), sys.exc_info())
    assert "KeyError: 'x'" in json.loads(JSONFormatter().format(failed))["traceback"]


def test_one_line_cuts_and_flattens():
    assert one_line("a\r\nb\nc") == "a\\nb\\nc"
    assert one_line("y" * 600) == "y" * 500 + "… (cut from 600 characters)"


def test_an_unknown_log_format_setting_is_refused():
    with override_settings(MYSQLQ={"LOG_FORMAT": "xml"}), pytest.raises(SettingsError) as err:
        load_settings()
    assert "MYSQLQ['LOG_FORMAT'] must be 'text' or 'json', not 'xml'." in str(err.value)
