"""Schedule rows against the real MariaDB, in this process, on a simulated database clock
(``SET timestamp`` moves ``UTC_TIMESTAMP()`` for this session only): sync, firing, the
daylight-saving days, pausing, tampered rows, and the park ending for a due schedule.
Real workers racing and catching up: tests/test_schedule_workers.py."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from django_mysqlq import broker
from django_mysqlq.broker import DeclaredSchedule
from django_mysqlq.models import Message, Schedule

pytestmark = pytest.mark.django_db(transaction=True)

UTC = dt.UTC


def declared(name: str = "report", cron: str = "* * * * *", zone: str = "UTC",
             catch_up: str = "skip") -> DeclaredSchedule:
    return DeclaredSchedule(
        name=name, source="code", task_name="tests.report", queue="cron", priority=0,
        max_attempts=3, retry_backoff=1.0, timeout=None, payload='{"args":[],"kwargs":{}}',
        cron=cron, timezone=zone, catch_up=catch_up)


@pytest.fixture
def clock() -> Iterator[object]:
    """Set this session's database clock: ``clock(datetime)``; reset after the test."""

    def set_to(moment: dt.datetime) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET timestamp = %s", [moment.timestamp()])

    yield set_to
    with connection.cursor() as cursor:
        cursor.execute("SET timestamp = DEFAULT")


def at(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)


def row(name: str = "report") -> Schedule:
    return Schedule.objects.get(name=name)


def run_ats(name_task: str = "tests.report") -> list[dt.datetime]:
    return list(Message.objects.filter(task_name=name_task).order_by("run_at")
                .values_list("run_at", flat=True))


def test_sync_writes_the_row_from_the_next_occurrence_and_marks_the_undeclared(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    synced = broker.sync_schedules([declared(), declared("old")])
    assert synced.added == ["old", "report"]
    assert row().next_run_at == at(2025, 1, 1, 12, 1)
    assert row().created_at == at(2025, 1, 1, 12, 0, 30)
    synced = broker.sync_schedules([declared()])
    assert synced.removed == ["old"] and not synced.changed
    assert row("old").removed_at is not None and row().removed_at is None
    # Removed rows don't fire, however due.
    clock(at(2025, 1, 1, 12, 5))
    broker.fire_due_schedules(grace=3600)
    assert Message.objects.count() == 5  # report's 12:01 … 12:05, nothing of 'old'
    assert broker.prune_schedules() == 1
    assert not Schedule.objects.filter(name="old").exists()


def test_a_sync_keeps_a_pending_catch_up_unless_the_expression_changed(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared()])
    clock(at(2025, 1, 1, 13, 0, 30))  # an hour later, nobody fired
    broker.sync_schedules([declared()])
    assert row().next_run_at == at(2025, 1, 1, 12, 1)  # kept: catch-up decides
    synced = broker.sync_schedules([declared(cron="*/5 * * * *")])
    assert synced.changed == ["report"]
    assert row().next_run_at == at(2025, 1, 1, 13, 5)  # from now, the new expression


def test_each_occurrence_fires_once_and_the_schedule_moves_on(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared()])
    for second in range(0, 185, 5):  # three minutes, checked every five seconds
        clock(at(2025, 1, 1, 12, 1) + dt.timedelta(seconds=second))
        broker.fire_due_schedules(grace=60)
    assert run_ats() == [at(2025, 1, 1, 12, m) for m in (1, 2, 3, 4)]
    schedule = row()
    assert schedule.last_run_at == at(2025, 1, 1, 12, 4)
    assert schedule.next_run_at == at(2025, 1, 1, 12, 5)
    assert schedule.last_message_id == Message.objects.order_by("id").last().pk
    message = Message.objects.get(pk=schedule.last_message_id)
    assert (message.status, message.queue, message.payload) == (
        "ready", "cron", '{"args":[],"kwargs":{}}')


def fire_through(clock, start: dt.datetime, end: dt.datetime, step_minutes: int) -> None:
    moment = start
    while moment <= end:
        clock(moment)
        broker.fire_due_schedules(grace=3600)
        moment += dt.timedelta(minutes=step_minutes)


def new_york(moments: list[dt.datetime]) -> list[str]:
    from zoneinfo import ZoneInfo

    return [m.astimezone(ZoneInfo("America/New_York")).strftime("%m-%d %H:%M%z")
            for m in moments]


def test_fall_back_day_runs_a_daily_1_30_once(clock):
    clock(at(2025, 10, 31, 12))
    broker.sync_schedules([declared(cron="30 1 * * *", zone="America/New_York")])
    fire_through(clock, at(2025, 10, 31, 12), at(2025, 11, 4, 12), 15)
    assert new_york(run_ats()) == ["11-01 01:30-0400", "11-02 01:30-0400",
                                   "11-03 01:30-0500", "11-04 01:30-0500"]


def test_spring_forward_day_runs_a_daily_2_30_once_at_3(clock):
    clock(at(2025, 3, 7, 12))
    broker.sync_schedules([declared(cron="30 2 * * *", zone="America/New_York")])
    fire_through(clock, at(2025, 3, 7, 12), at(2025, 3, 11, 12), 15)
    assert new_york(run_ats()) == ["03-08 02:30-0500", "03-09 03:00-0400",
                                   "03-10 02:30-0400", "03-11 02:30-0400"]


def test_two_racing_checks_enqueue_each_occurrence_once(clock):
    """Threads on their own connections, on the real clock: every check that finds the
    occurrence due races for it; the conditional update lets one through."""
    with connection.cursor() as cursor:
        cursor.execute("SET timestamp = DEFAULT")
    broker.sync_schedules([declared(cron="* * * * * *", catch_up="all")])
    Schedule.objects.update(created_at=at(2020, 1, 1),
                            next_run_at=broker.database_now().replace(microsecond=0)
                            - dt.timedelta(seconds=3))
    barrier = threading.Barrier(4)
    fired: list[int] = []
    errors: list[BaseException] = []

    def check() -> None:
        try:
            barrier.wait()
            until = time.monotonic() + 2.5
            while time.monotonic() < until:
                fired.extend(i for f in broker.fire_due_schedules(grace=60)
                             for i in f.message_ids)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=check) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    times = run_ats()
    assert len(times) == len(set(times)) == len(fired) >= 5
    # No gap either: one message a second from the first pending one on.
    assert times == [times[0] + dt.timedelta(seconds=n) for n in range(len(times))]


def test_pause_stops_it_and_resume_starts_from_now_without_the_paused_ones(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared(catch_up="all")])
    assert broker.set_schedules_paused(["report", "nope"], True, "cli:root") == ["report"]
    assert broker.set_schedules_paused(["report"], True, "cli:root") == []  # already
    clock(at(2025, 1, 1, 13))
    assert broker.fire_due_schedules(grace=60) == []
    assert row().changed_by == "cli:root" and row().paused
    assert broker.set_schedules_paused(["report"], False, "admin:alice") == ["report"]
    schedule = row()
    assert not schedule.paused and schedule.next_run_at == at(2025, 1, 1, 13, 1)
    clock(at(2025, 1, 1, 13, 1, 5))
    broker.fire_due_schedules(grace=60)
    assert run_ats() == [at(2025, 1, 1, 13, 1)]  # nothing of the paused hour


def test_a_wiped_next_run_time_is_repaired_without_firing(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared(catch_up="all")])
    Schedule.objects.update(next_run_at=None)
    [fired] = broker.fire_due_schedules(grace=60)
    assert fired.message_ids == [] and row().next_run_at == at(2025, 1, 1, 12, 1)


def test_a_garbage_past_time_fires_nothing_from_before_the_row_existed(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared(catch_up="all")])
    Schedule.objects.update(next_run_at=at(1970, 1, 1))
    clock(at(2025, 1, 1, 12, 3, 10))
    broker.fire_due_schedules(grace=60)
    assert run_ats() == [at(2025, 1, 1, 12, m) for m in (1, 2, 3)]


def test_a_zero_date_the_driver_can_not_read_is_repaired(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared()])
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION sql_mode = ''")
        try:
            cursor.execute("UPDATE mysqlq_schedule SET next_run_at = '0000-00-00 00:00:00'")
        finally:
            cursor.execute("SET SESSION sql_mode = DEFAULT")
    [fired] = broker.fire_due_schedules(grace=60)
    assert fired.message_ids == []
    assert row().next_run_at == at(2025, 1, 1, 12, 1)
    assert broker.fire_due_schedules(grace=60) == []  # not due again: no loop


def test_a_far_future_time_is_repaired_by_the_next_sync(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared()])
    Schedule.objects.update(next_run_at=at(2999, 1, 1))
    broker.sync_schedules([declared()])
    assert row().next_run_at == at(2025, 1, 1, 12, 1)


def test_an_expression_changed_by_hand_into_garbage_stops_only_that_schedule(clock, caplog):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared(), declared("other", cron="*/2 * * * *")])
    Schedule.objects.filter(name="report").update(cron="every tuesday")
    clock(at(2025, 1, 1, 12, 2, 5))
    [fired] = broker.fire_due_schedules(grace=60)
    assert fired.name == "other"
    broken = row()
    assert "is not a valid cron expression" in broken.error
    assert "Schedule 'report' can't fire" in caplog.text
    assert broker.fire_due_schedules(grace=60) == []  # skipped, not retried in a loop
    # A worker whose code declares it writes the row again, and it fires from now.
    broker.sync_schedules([declared(), declared("other", cron="*/2 * * * *")])
    assert row().error == "" and row().cron == "* * * * *"
    assert row().next_run_at == at(2025, 1, 1, 12, 3)


def test_resuming_a_broken_schedule_says_why_it_can_not_run(clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared()])
    broker.set_schedules_paused(["report"], True, "cli:root")
    Schedule.objects.update(timezone="Nowhere/Land")
    broker.set_schedules_paused(["report"], False, "cli:root")
    assert "not a time zone" in row().error and row().next_run_at is None


# ------------------------------------------------------------------------ the park

def test_a_due_schedule_ends_a_park_and_a_paused_one_does_not():
    broker.sync_schedules([declared(cron="* * * * * *")])
    Schedule.objects.update(next_run_at=at(2020, 1, 1))
    state, _ = broker.idle_wait(["nothing-here"], 5.0)
    assert state == "due"
    for change in ({"paused": True}, {"paused": False, "removed_at": at(2020, 1, 1)},
                   {"removed_at": None, "error": "broken"}):
        Schedule.objects.update(**change)
        state, _ = broker.idle_wait(["nothing-here"], 0.2)
        assert state == "slept", change


def test_a_park_sleeps_until_the_next_occurrence_only():
    broker.sync_schedules([declared(cron="0 0 1 1 *")])
    Schedule.objects.update(next_run_at=dt.datetime.now(UTC) + dt.timedelta(seconds=0.4))
    began = time.monotonic()
    state, _ = broker.idle_wait(["nothing-here"], 30.0)
    assert state == "due" and time.monotonic() - began < 10  # (slept until it was due)
    state, _ = broker.idle_wait(["nothing-here"], 30.0)
    assert state == "due"


def test_an_expression_changed_by_hand_into_one_that_ran_out_stops_only_that_schedule(
        clock):
    clock(at(2025, 1, 1, 12, 0, 30))
    broker.sync_schedules([declared(), declared("other", cron="*/2 * * * *")])
    Schedule.objects.filter(name="report").update(cron="0 0 1 1 * 0 2024")  # a year: 2024
    clock(at(2025, 1, 1, 12, 2, 5))
    [fired] = broker.fire_due_schedules(grace=60)
    assert fired.name == "other"
    assert "has 7 fields" in row().error  # (parse refuses it before it could run out)
