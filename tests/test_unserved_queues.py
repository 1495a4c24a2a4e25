"""Nothing waits silently: queues nobody serves are shown, and a plain worker serves every
queue its tasks use.

The broker's view (live workers' queues against the claim index), ``queuestats``, the
admin dashboard, a worker's start-up warnings, and which queues ``runqueueworker`` serves
with no ``--queues`` or ``--queues '*'``.
"""

from __future__ import annotations

import io
import json
import signal
import sys
import types

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_mysqlq import broker
from django_mysqlq.backend.queues import declared_queues
from django_mysqlq.broker import unserved
from django_mysqlq.models import Message
from django_mysqlq.worker.queues import known_queues
from tests.burst import run_burst
from tests.conftest import wait_for
from tests.plan_support import access, costly
from tests.testapp import tasks
from tests.testapp.models import Ledger

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "/admin/django_mysqlq/queuestate/"


def enqueue(queue: str, count: int = 1) -> None:
    tasks.record.using(queue=queue).enqueue_many([[f"{queue}{i}"] for i in range(count)])


def worker_row(worker_id: str, queues: str, *, silent: float = 0, stopped: bool = False) -> None:
    """A worker as it registered, last heard from ``silent`` seconds ago."""
    broker.register_worker(worker_id, "h", 1, queues.split(","), 1)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_worker SET last_heartbeat = UTC_TIMESTAMP(6) - INTERVAL "
                       "%s SECOND, stopped_at = IF(%s, UTC_TIMESTAMP(6), NULL) WHERE id = %s",
                       [silent, stopped, worker_id])


# --------------------------------------------------------------------------- the broker


def test_queues_with_ready_messages_and_no_live_worker_are_unserved():
    enqueue("emails", 3)
    enqueue("served", 2)
    enqueue("stale", 1)
    enqueue("gone", 1)
    tasks.record.using(queue="later", delay=3600).enqueue("not ready")  # scheduled only
    worker_row("w-live", "served,other")
    worker_row("w-stale", "stale", silent=60)  # past the 10 s lease
    worker_row("w-stopped", "gone", stopped=True)
    found = {q.queue: q for q in broker.unserved_queues()}
    assert sorted(found) == ["emails", "gone", "stale"]
    assert (found["emails"].ready, found["emails"].capped) == (3, False)
    assert 0 <= found["emails"].oldest_seconds < 60
    assert broker.served_queues() == {"served", "other"}
    # A queue this worker is about to serve counts as served.
    assert [q.queue for q in broker.unserved_queues(also_served=["gone", "stale"])] == [
        "emails"]


def test_the_ready_count_stops_at_the_cap_and_says_so():
    enqueue("emails", 5)
    [emails] = broker.unserved_queues(cap=3)
    assert (emails.ready, emails.capped) == (3, True)
    assert emails.describe().startswith("emails (3+ ready, oldest ")
    assert unserved.UnservedQueue("emails", 1204, False, 180.0).describe() == \
        "emails (1,204 ready, oldest 3 min)"
    assert broker.describe_unserved([emails]).startswith(
        "queues with messages that no worker serves: emails (3+ ready")


def test_a_worker_serving_many_queues_keeps_every_name():
    names = [f"queue-number-{i:03d}-{'x' * 40}" for i in range(40)]  # over 2,000 characters
    worker_row("w-many", ",".join(names))
    enqueue(names[-1])
    assert broker.served_queues() >= set(names)
    assert broker.unserved_queues() == []


def test_the_workers_statements_read_along_indexes_and_stop():
    tasks.record.using(queue="big").enqueue_many([[f"b{i}"] for i in range(3000)])
    enqueue("emails", 50)
    worker_row("w-live", "default")
    with CaptureQueriesContext(connection) as captured:
        assert [q.queue for q in broker.unserved_queues(cap=100)] == ["big", "emails"]
    sqls = [q["sql"] for q in captured.captured_queries if "mysqlq_" in q["sql"]]
    assert sqls
    assert {sql: costly(sql) for sql in sqls} == {sql: [] for sql in sqls}
    [(table, index, kind)] = access(unserved.SERVED_QUEUES_SQL, [10_000_000])
    assert (table, index, kind) == ("mysqlq_worker", "mysqlq_wrk_heartbeat", "range")


# --------------------------------------------------------------------------- queuestats, admin


def test_queuestats_marks_unserved_queues_in_its_table_and_json():
    enqueue("emails", 2)
    tasks.record.enqueue("d")
    worker_row("w-live", "default")
    out = io.StringIO()
    call_command("queuestats", stdout=out)
    lines = out.getvalue().splitlines()
    assert any(line.startswith("emails (no worker)") for line in lines)
    assert any(line.startswith("default ") for line in lines)
    assert any(line.startswith("WARNING: queues with messages that no worker serves: "
                               "emails (2 ready, oldest ") for line in lines)
    out = io.StringIO()
    call_command("queuestats", "--json", stdout=out)
    data = json.loads(out.getvalue())
    [emails] = data["unserved"]
    assert (emails["queue"], emails["ready"], emails["ready_capped"]) == ("emails", 2, False)
    by_name = {q["name"]: q for q in data["queues"]}
    assert by_name["emails"]["unserved"] is True and by_name["default"]["unserved"] is False


def test_the_dashboard_shows_unserved_queues(root):
    enqueue("emails", 2)
    page = root.get(DASHBOARD).content.decode()
    assert 'id="unserved"' in page
    assert "Queues with messages that no worker serves: emails (2 ready, oldest " in page
    assert "runqueueworker --queues emails" in page
    assert ">no worker</span>" in page
    worker_row("w-live", "emails")
    assert 'id="unserved"' not in root.get(DASHBOARD).content.decode()


# --------------------------------------------------------------------------- the worker


@pytest.mark.worker
def test_a_starting_worker_warns_of_queues_no_worker_serves(start_worker):
    enqueue("emails", 3)
    enqueue("reports", 1)
    tasks.record.enqueue("mine")
    worker = start_worker("--queues", "default")
    wait_for(lambda: "queues with messages that no worker serves" in worker.output(),
             timeout=30, message="the start-up warning")
    [line] = [line for line in worker.output().splitlines() if "no worker serves" in line]
    assert ": queues with messages that no worker serves: emails (3 ready, oldest " in line
    assert "reports (1 ready, oldest " in line
    assert "default" not in line.split("serves: ")[1].split(". Start")[0]  # its own queue
    assert "runqueueworker --queues emails,reports" in line
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


@pytest.mark.worker
def test_a_plain_worker_serves_every_queue_its_tasks_use(start_worker):
    tasks.record.enqueue("on default")
    tasks.on_other_queue.enqueue("on other")
    counts, output = run_burst(start_worker)
    assert counts["succeeded"] == 2
    assert sorted(Ledger.objects.values_list("label", flat=True)) == ["on default", "on other"]
    assert " started: queues=default,other " in output
    assert "no worker serves" not in output


@pytest.mark.worker
def test_queues_star_is_every_known_queue_too(start_worker):
    tasks.on_other_queue.enqueue("star")
    counts, output = run_burst(start_worker, "--queues", "*")
    assert counts["succeeded"] == 1
    assert " started: queues=default,other " in output


@pytest.mark.worker
def test_a_queue_no_task_uses_is_served_with_a_warning(start_worker):
    tasks.record.using(queue="emials").enqueue("typo")
    counts, output = run_burst(start_worker, "--queues", "default,emials")
    assert counts["succeeded"] == 1  # .using(queue=...) can send anything anywhere
    assert ("queue 'emials' is served, but no task this worker knows uses it (known: "
            "default, other)") in output
    assert "queue 'default' is served, but" not in output


def test_star_goes_alone():
    with pytest.raises(CommandError, match=r"'\*' means every known queue: give it alone, "
                                           "not with default."):
        call_command("runqueueworker", "--queues", "*,default", "--burst")
    assert not Message.objects.exists()


def known_in_a_report(label):
    return label


def test_django_tasks_bring_their_queue_names_and_their_backends_queues():
    tasks_setting = {**settings.TASKS, "anyq": {
        "BACKEND": "django_mysqlq.backend.MySQLQueueBackend", "QUEUES": []}}
    module = types.ModuleType("tests_dynamic_task_module")
    mysqlq = {**settings.MYSQLQ,
              "TASK_MODULES": [*settings.MYSQLQ["TASK_MODULES"], module.__name__]}
    # The registry holds whatever @queue_task modules this process imported so far (other
    # tests import more), so compare with what it knew before.
    before = known_queues()
    assert {"default", "other"} <= before and "reports" not in before
    with override_settings(TASKS=tasks_setting, MYSQLQ=mysqlq):
        module.report = task(backend="anyq", queue_name="reports")(known_in_a_report)
        sys.modules[module.__name__] = module
        try:
            assert declared_queues() == {"default", "other", "reports"}
            assert known_queues() == before | {"reports"}
        finally:
            del sys.modules[module.__name__]
    assert known_queues() == before


@pytest.mark.worker
def test_a_group_no_handler_subscribes_is_named_as_a_group(start_worker):
    """``--groups nosuch``: the warning was the task queue's ('no task this worker knows
    uses it … .using(queue=…)'), never saying no handler is subscribed with that group."""
    _, output = run_burst(start_worker, "--groups", "nosuch")
    assert ("group 'nosuch' is served (queue 'group:nosuch'), but no handler this worker "
            "knows is subscribed with group='nosuch'") in output
    assert "no task this worker knows uses it" not in output
