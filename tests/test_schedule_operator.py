"""What an operator sees of recurring tasks and does with them: ``queueschedule``,
``queuestats`` (table and JSON), the admin's schedule list and actions, the dashboard."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.broker import DeclaredSchedule
from django_mysqlq.models import Schedule
from tests.operator_support import user

pytestmark = pytest.mark.django_db(transaction=True)

SCHEDULES = reverse("admin:django_mysqlq_schedule_changelist")
DASHBOARD = reverse("admin:django_mysqlq_queuestate_changelist")


def declared(name: str, cron: str = "30 1 * * *", zone: str = "America/New_York",
             catch_up: str = "latest") -> DeclaredSchedule:
    return DeclaredSchedule(
        name=name, source="settings", task_name="shop.tasks.report", queue="reports",
        priority=0, max_attempts=3, retry_backoff=2.0, timeout=None,
        payload='{"args":[],"kwargs":{}}', cron=cron, timezone=zone, catch_up=catch_up)


@pytest.fixture
def three_schedules(monkeypatch: pytest.MonkeyPatch) -> None:
    """nightly (active, run once), hourly (paused), gone (removed), broken (bad zone).

    Only these: the cron tasks other test modules declare (imported before this one in a
    whole run) would otherwise show as declared, widen the table's columns and be written
    by ``queueschedule``."""
    from django_mysqlq import recurring

    monkeypatch.setattr(recurring, "_declared", lambda strict: [])
    broker.sync_schedules([declared("nightly"), declared("hourly", cron="0 * * * *"),
                           declared("gone"), declared("broken")])
    broker.sync_schedules([declared("nightly"), declared("hourly", cron="0 * * * *"),
                           declared("broken")])
    Schedule.objects.filter(name="nightly").update(
        last_run_at=dt.datetime(2025, 11, 2, 5, 30, tzinfo=dt.UTC), last_message_id=42,
        next_run_at=dt.datetime(2025, 11, 3, 6, 30, tzinfo=dt.UTC))
    broker.set_schedules_paused(["hourly"], True, "cli:root")
    Schedule.objects.filter(name="broken").update(error="time zone 'X' is not known")


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_queueschedule_lists_each_schedule_with_its_last_and_next_run(three_schedules):
    lines = run("queueschedule").splitlines()
    assert lines[0].split() == ["schedule", "task", "cron", "zone", "catch-up", "state",
                                "last", "run", "next", "run"]
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert "30 1 * * *  America/New_York  latest    active" in nightly
    assert "2025-11-02 01:30:00 EDT" in nightly and "2025-11-03 01:30:00 EST" in nightly
    assert "- (paused)" in next(line for line in lines if line.startswith("hourly"))
    assert "- (removed)" in next(line for line in lines if line.startswith("gone"))
    assert "broken: time zone 'X' is not known" in lines
    data = {row["name"]: row for row in json.loads(run("queueschedule", "--json"))}
    assert data["nightly"]["last_run_at"] == "2025-11-02T05:30:00+00:00"
    assert data["nightly"]["next_run_at"] == "2025-11-03T06:30:00+00:00"
    assert data["nightly"]["last_message_id"] == 42
    assert (data["hourly"]["state"], data["hourly"]["paused"]) == ("paused", True)
    assert data["hourly"]["next_run_at"] is None
    assert data["gone"]["state"] == "removed" and data["broken"]["state"] == "broken"


def test_queueschedule_pause_resume_and_prune(three_schedules):
    assert run("queueschedule", "pause", "nightly").strip() == "Paused: nightly."
    assert run("queueschedule", "pause", "nightly").strip() == "Paused: none (already so)."
    assert Schedule.objects.get(name="nightly").paused
    assert run("queueschedule", "resume", "nightly", "hourly").strip() == \
        "Resumed: hourly, nightly."
    assert not Schedule.objects.filter(paused=True).exists()
    assert run("queueschedule", "prune").strip() == "Deleted 1 removed schedule(s)."
    assert sorted(Schedule.objects.values_list("name", flat=True)) == [
        "broken", "hourly", "nightly"]


def test_queueschedule_json_answers_every_action_in_json(three_schedules):
    """``--json`` is machine-readable on stdout for each action, not only ``list``."""
    def as_json(*args: str) -> dict:
        return json.loads(run("queueschedule", *args, "--json"))

    assert as_json("pause", "nightly", "hourly") == {
        "action": "pause", "changed": ["nightly"], "unchanged": ["hourly"]}
    assert as_json("resume", "nightly") == {
        "action": "resume", "changed": ["nightly"], "unchanged": []}
    ran = as_json("run", "nightly")
    assert ran["action"] == "run" and list(ran["enqueued"]) == ["nightly"]
    assert isinstance(ran["enqueued"]["nightly"], int)
    assert as_json("prune") == {"action": "prune", "deleted": 1}


@pytest.mark.parametrize("args, fragment", [
    (("pause",), "pause needs the names"),
    (("pause", "nope"), "No schedule named 'nope'; known: broken, gone, hourly, nightly."),
    (("list", "nightly"), "list takes no names"),
])
def test_queueschedule_refuses_bad_arguments_clearly(three_schedules, args, fragment):
    with pytest.raises(CommandError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        call_command("queueschedule", *args)


def test_queuestats_shows_the_schedules_in_its_table_and_json(three_schedules):
    table = run("queuestats")
    assert "schedule  task" in table and "nightly" in table and "- (paused)" in table
    data = json.loads(run("queuestats", "--json"))
    stored = [row for row in data["schedules"] if row["stored"]]  # other tests' cron tasks
    assert [row["name"] for row in stored] == ["broken", "gone", "hourly", "nightly"]
    assert stored[3]["last_run_at"] == "2025-11-02T05:30:00+00:00"


def test_the_admin_lists_schedules_and_filters_by_state(root, three_schedules):
    page = root.get(SCHEDULES).content.decode()
    for text in ("nightly", "2025-11-02 01:30:00 EDT", "2025-11-03 01:30:00 EST",
                 "- (paused)", "?message_id=42"):
        assert text in page
    assert "nightly" not in root.get(SCHEDULES + "?state=paused").content.decode()
    assert "gone" in root.get(SCHEDULES + "?state=removed").content.decode()
    detail = root.get(reverse("admin:django_mysqlq_schedule_change",
                              args=["broken"])).content.decode()
    assert "time zone &#x27;X&#x27; is not known" in detail


def test_admin_actions_pause_resume_and_prune_with_their_permission(root, three_schedules):
    response = root.post(SCHEDULES, {"action": "pause_selected",
                                     "_selected_action": ["nightly"]}, follow=True)
    assert "Paused 1 schedule(s)" in response.content.decode()
    row = Schedule.objects.get(name="nightly")
    assert row.paused and row.changed_by == "admin:root"
    root.post(SCHEDULES, {"action": "resume_selected", "_selected_action": ["nightly"]})
    assert not Schedule.objects.get(name="nightly").paused
    response = root.post(SCHEDULES, {"action": "prune_selected",
                                     "_selected_action": ["gone", "nightly"]}, follow=True)
    assert "Deleted 1 removed schedule(s); 1 skipped" in response.content.decode()
    assert not Schedule.objects.filter(name="gone").exists()


def test_a_viewer_sees_schedules_but_can_not_pause_them(three_schedules):
    viewer = Client()
    viewer.force_login(user("viewer"))
    page = viewer.get(SCHEDULES)
    assert page.status_code == 200 and b"pause_selected" not in page.content
    viewer.post(SCHEDULES, {"action": "pause_selected", "_selected_action": ["nightly"]})
    assert not Schedule.objects.get(name="nightly").paused
    operator = Client()
    operator.force_login(user("operator", "pause_schedule"))
    assert b"pause_selected" in operator.get(SCHEDULES).content
    nobody = Client()
    nobody.force_login(User.objects.create_user("nobody", password="pw", is_staff=True))
    assert nobody.get(SCHEDULES).status_code == 403


def test_schedules_are_read_only_in_the_admin(root, three_schedules):
    detail = reverse("admin:django_mysqlq_schedule_change", args=["nightly"])
    root.post(detail, {"cron": "* * * * *"})
    assert Schedule.objects.get(name="nightly").cron == "30 1 * * *"
    assert root.get(reverse("admin:django_mysqlq_schedule_add")).status_code == 403


def test_the_dashboard_shows_the_schedules(root, three_schedules):
    page = root.get(DASHBOARD).content.decode()
    assert 'id="schedules"' in page and 'id="schedule-nightly"' in page
    assert "2025-11-03 01:30:00 EST" in page and "paused" in page


def test_run_now_enqueues_one_extra_run_and_moves_nothing(three_schedules, root):
    from django_mysqlq.models import Message

    before = Schedule.objects.get(name="nightly")
    out = run("queueschedule", "run", "nightly", "hourly")
    made = dict(Message.objects.values_list("pk", "task_name"))
    assert len(made) == 2 and set(made.values()) == {"shop.tasks.report"}
    assert out.startswith("Enqueued: nightly (#") and "hourly (#" in out
    after = Schedule.objects.get(name="nightly")
    assert (after.next_run_at, after.last_run_at, after.last_message_id) == (
        before.next_run_at, before.last_run_at, before.last_message_id)
    message = Message.objects.get(pk=max(made))
    assert (message.status, message.queue) == ("ready", "reports")
    response = root.post(SCHEDULES, {"action": "run_selected",
                                     "_selected_action": ["nightly"]}, follow=True)
    assert "Enqueued one run now of 1 schedule(s): nightly (#" in response.content.decode()
    assert Message.objects.count() == 3
    with pytest.raises(CommandError, match="run needs the names"):
        call_command("queueschedule", "run")


def test_a_settings_schedule_can_be_listed_paused_and_run_before_any_worker_started(
        settings):
    """``MYSQLQ['SCHEDULES']`` declared, no worker started yet: ``queueschedule`` writes the
    missing rows as a starting worker would (existing ones untouched), so the docs'
    ``queueschedule pause nightly-report`` works at once, and the worker keeps the pause."""
    settings.MYSQLQ = {**settings.MYSQLQ, "SCHEDULES": {
        "nightly-report": {"task": "tests.testapp.tasks.record", "cron": "0 3 * * *",
                           "tz": "Europe/Paris", "catch_up": "latest",
                           "args": ["nightly"]}}}
    assert not Schedule.objects.filter(name="nightly-report").exists()
    assert run("queueschedule", "pause", "nightly-report") == "Paused: nightly-report.\n"
    row = Schedule.objects.get(name="nightly-report")
    assert (row.paused, row.cron, row.timezone, row.catch_up) == (
        True, "0 3 * * *", "Europe/Paris", "latest")
    listed = next(line for line in run("queueschedule").splitlines()
                  if line.startswith("nightly-report"))
    assert "paused" in listed
    # A starting worker's sync keeps the operator's pause.
    from django_mysqlq import recurring

    broker.sync_schedules([s for s in recurring.declared() if s.name == "nightly-report"])
    assert Schedule.objects.get(name="nightly-report").paused
    assert run("queueschedule", "run", "nightly-report").startswith("Enqueued: nightly-report")


@pytest.fixture
def declared_nowhere_stored(settings):
    """A settings schedule and a cron task, before any worker (or ``queueschedule``) wrote
    their rows."""
    from django_mysqlq import queue_task
    from django_mysqlq.registry import registry

    def tidy() -> None: ...

    queue_task(cron="15 4 * * *", cron_tz="UTC", name="tests.operator.tidy")(tidy)
    settings.MYSQLQ = {**settings.MYSQLQ, "SCHEDULES": {
        "nightly-report": {"task": "tests.testapp.tasks.record", "cron": "0 3 * * *",
                           "tz": "Europe/Paris", "args": ["nightly"]}}}
    yield
    registry._tasks.pop("tests.operator.tidy", None)


def next_at(expression: str, zone: str) -> str:
    from zoneinfo import ZoneInfo

    from django_mysqlq.cron import Cron

    moment = Cron.parse(expression, zone).after(dt.datetime.now(dt.UTC))
    return moment.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S %Z")


def test_declared_schedules_show_before_any_worker_wrote_them(declared_nowhere_stored, root):
    table = run("queuestats")
    report = next(line for line in table.splitlines() if line.startswith("nightly-report"))
    tidy = next(line for line in table.splitlines() if line.startswith("tests.operator.tidy"))
    assert "active (not written yet)" in report and "never" in report
    assert next_at("0 3 * * *", "Europe/Paris") in report
    assert "15 4 * * *" in tidy and next_at("15 4 * * *", "UTC") in tidy
    data = {row["name"]: row for row in json.loads(run("queuestats", "--json"))["schedules"]}
    assert data["nightly-report"]["stored"] is False
    assert data["nightly-report"]["last_run_at"] is None
    assert data["nightly-report"]["next_run_at"] is not None
    assert data["tests.operator.tidy"]["source"] == "code"
    page = root.get(SCHEDULES).content.decode()
    assert 'id="unstored-nightly-report"' in page and 'id="unstored-testsoperatortidy"' in page
    assert next_at("0 3 * * *", "Europe/Paris") in page and "never" in page
    dashboard = root.get(DASHBOARD).content.decode()
    assert 'id="schedule-nightly-report"' in dashboard
    # Read-only views: nothing was written.
    assert not Schedule.objects.exists()
    # Once written (as a worker's start does), the row is shown, once, from the table.
    run("queueschedule", "pause", "nightly-report")
    page = root.get(SCHEDULES).content.decode()
    assert 'id="unstored-nightly-report"' not in page and "nightly-report" in page
    data = {row["name"]: row for row in json.loads(run("queuestats", "--json"))["schedules"]}
    assert (data["nightly-report"]["stored"], data["nightly-report"]["state"]) == (
        True, "paused")


def test_a_repeated_prune_of_a_deleted_schedule_deletes_no_other(root, three_schedules):
    """A second POST (a reload, a double click) of 'delete the selected removed schedules'
    for a schedule already gone selects nothing: that must delete nothing, not every
    removed schedule."""
    Schedule.objects.filter(name="hourly").update(removed_at=dt.datetime(2025, 1, 1,
                                                                         tzinfo=dt.UTC))
    form = {"action": "prune_selected", "_selected_action": ["gone"]}
    assert "Deleted 1 removed schedule(s)." in root.post(SCHEDULES, form,
                                                         follow=True).content.decode()
    again = root.post(SCHEDULES, form, follow=True).content.decode()
    assert "nothing deleted" in again and "-1 skipped" not in again
    assert Schedule.objects.filter(name="hourly").exists()
    assert broker.prune_schedules([]) == 0
    assert Schedule.objects.filter(name="hourly").exists()
    assert broker.prune_schedules() == 1


def test_a_bad_declaration_is_reported_and_the_others_are_written(settings):
    """One ``MYSQLQ['SCHEDULES']`` entry names no registered task: ``queueschedule`` says
    so on stderr and still writes the good one, which can be paused at once."""
    settings.MYSQLQ = {**settings.MYSQLQ, "SCHEDULES": {
        "a-broken": {"task": "tests.testapp.tasks.no_such_task", "cron": "0 4 * * *"},
        "nightly-report": {"task": "tests.testapp.tasks.record", "cron": "0 3 * * *",
                           "args": ["nightly"]}}}
    out, err = io.StringIO(), io.StringIO()
    call_command("queueschedule", "pause", "nightly-report", stdout=out, stderr=err)
    assert out.getvalue() == "Paused: nightly-report.\n"
    assert "MYSQLQ['SCHEDULES']['a-broken'] names the task " in err.getvalue()
    assert "nightly-report" not in err.getvalue()
    assert Schedule.objects.get(name="nightly-report").paused
    assert not Schedule.objects.filter(name="a-broken").exists()
