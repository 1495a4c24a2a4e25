"""Cron expressions in a zone, the daylight-saving rules, the catch-up plans, and the
checks of ``@queue_task(cron=...)`` and ``MYSQLQ['SCHEDULES']`` (no database)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_mysqlq import InvalidTaskOptions, cron, queue_task
from django_mysqlq.checks import check_schedules, check_settings
from django_mysqlq.cron import CATCH_UP_LIMIT, Cron, plan
from django_mysqlq.recurring import declared

UTC = dt.UTC
NEW_YORK = "America/New_York"


def at(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)


def local(moments: list[dt.datetime], zone: str = NEW_YORK) -> list[str]:
    from zoneinfo import ZoneInfo

    return [m.astimezone(ZoneInfo(zone)).strftime("%m-%d %H:%M%z") for m in moments]


# ------------------------------------------------------------------- daylight saving

def test_a_wall_time_skipped_by_spring_forward_runs_once_just_after_the_gap():
    cron = Cron.parse("30 2 * * *", NEW_YORK)
    runs = cron.between(at(2025, 3, 7), at(2025, 3, 11), 100)
    assert local(runs) == ["03-07 02:30-0500", "03-08 02:30-0500", "03-09 03:00-0400",
                           "03-10 02:30-0400"]


def test_a_wall_time_repeated_by_fall_back_runs_once_at_its_first_instant():
    cron = Cron.parse("30 1 * * *", NEW_YORK)
    runs = cron.between(at(2025, 10, 31), at(2025, 11, 5), 100)
    assert local(runs) == ["10-31 01:30-0400", "11-01 01:30-0400", "11-02 01:30-0400",
                           "11-03 01:30-0500", "11-04 01:30-0500"]
    # Starting inside the repeated hour: the next run is the next day's.
    assert local([cron.after(at(2025, 11, 2, 6, 45))]) == ["11-03 01:30-0500"]


def test_an_hourly_schedule_runs_in_both_repeated_hours_they_are_real_hours():
    cron = Cron.parse("0 * * * *", NEW_YORK)
    runs = cron.between(at(2025, 11, 2, 4), at(2025, 11, 2, 8), 100)
    assert local(runs) == ["11-02 00:00-0400", "11-02 01:00-0400", "11-02 01:00-0500",
                           "11-02 02:00-0500", "11-02 03:00-0500"]
    assert [r.hour for r in runs] == [4, 5, 6, 7, 8]  # one an hour of real time


def test_six_fields_count_seconds_and_a_fraction_is_never_an_occurrence():
    cron = Cron.parse("* * * * * */2", "UTC")
    assert cron.after(at(2025, 1, 1, 10, 0, 0)) == at(2025, 1, 1, 10, 0, 2)
    start = at(2025, 1, 1, 10, 0, 0) + dt.timedelta(microseconds=500_000)
    assert cron.between(start, at(2025, 1, 1, 10, 0, 6), 10) == [
        at(2025, 1, 1, 10, 0, 2), at(2025, 1, 1, 10, 0, 4), at(2025, 1, 1, 10, 0, 6)]


# ------------------------------------------------------------------------- catch-up

EVERY_MINUTE = Cron.parse("* * * * *", "UTC")
NOW = at(2025, 1, 1, 12, 0, 30)
TEN_MINUTES_DOWN = at(2025, 1, 1, 11, 50)


def minutes(moments: list[dt.datetime]) -> list[str]:
    return [m.strftime("%H:%M") for m in moments]


def test_on_time_occurrences_fire_under_every_policy():
    for policy in ("skip", "latest", "all"):
        result = plan(EVERY_MINUTE, at(2025, 1, 1, 12, 0), NOW, policy, grace=60)
        assert minutes(result.fire) == ["12:00"]
        assert result.next_run_at == at(2025, 1, 1, 12, 1)
        assert result.dropped == 0


def test_skip_fires_none_of_the_missed():
    result = plan(EVERY_MINUTE, TEN_MINUTES_DOWN, NOW, "skip", grace=20)
    assert result.fire == []
    assert result.dropped == 11  # 11:50 … 12:00, all older than 20 s
    assert result.next_run_at == at(2025, 1, 1, 12, 1)


def test_latest_fires_the_most_recent_missed_one_once():
    result = plan(EVERY_MINUTE, TEN_MINUTES_DOWN, NOW, "latest", grace=20)
    assert minutes(result.fire) == ["12:00"]
    assert result.dropped == 10
    # With an on-time one as well, the newest missed one joins it.
    result = plan(EVERY_MINUTE, TEN_MINUTES_DOWN, NOW, "latest", grace=60)
    assert minutes(result.fire) == ["11:59", "12:00"]


def test_all_fires_every_missed_one_oldest_first():
    result = plan(EVERY_MINUTE, TEN_MINUTES_DOWN, NOW, "all", grace=20)
    assert minutes(result.fire) == [f"11:{m}" for m in range(50, 60)] + ["12:00"]
    assert result.dropped == 0 and not result.dropped_capped


def test_all_is_bounded_to_the_most_recent_limit_and_says_there_were_more():
    result = plan(EVERY_MINUTE, at(2024, 1, 1), NOW, "all", grace=60)
    assert len(result.fire) == CATCH_UP_LIMIT + 1  # the missed ones, and 12:00 on time
    assert result.fire[-1] == at(2025, 1, 1, 12, 0)
    assert result.fire[0] == at(2025, 1, 1, 12, 0) - dt.timedelta(minutes=CATCH_UP_LIMIT)
    assert result.dropped_capped


def test_a_wiped_next_run_time_fires_nothing_and_starts_from_now():
    result = plan(EVERY_MINUTE, None, NOW, "all", grace=60)
    assert result.fire == [] and result.next_run_at == at(2025, 1, 1, 12, 1)


def test_a_daily_catch_up_across_fall_back_still_counts_each_day_once():
    cron = Cron.parse("30 1 * * *", NEW_YORK)
    result = plan(cron, at(2025, 10, 30, 5, 30), at(2025, 11, 4, 12), "all", grace=60)
    assert local(result.fire) == ["10-30 01:30-0400", "10-31 01:30-0400", "11-01 01:30-0400",
                                  "11-02 01:30-0400", "11-03 01:30-0500", "11-04 01:30-0500"]


# ------------------------------------------------------------- declaring a schedule

def declare(**options):
    def report(period: str = "day") -> None: ...

    return queue_task(name=f"tests.declared.{len(options)}", **options)(report)


@pytest.mark.parametrize("options, fragment", [
    ({"cron": "*/5 * * *"}, "is not a valid cron expression"),
    ({"cron": "61 * * * *"}, "out of range"),
    ({"cron": "0 0 31 2 *"}, "never fires"),
    ({"cron": ""}, "must be a cron expression"),
    ({"cron": 5}, "must be a cron expression"),
    ({"cron": "* * * * *", "cron_tz": "Mars/Olympus"}, "not a time zone this machine knows"),
    ({"cron": "* * * * *", "catch_up": "some"}, "catch_up must be one of"),
    ({"cron": "* * * * *", "cron_args": "day"}, "cron_args must be a list or tuple"),
    ({"cron": "* * * * *", "cron_kwargs": {1: 2}}, "cron_kwargs must be a dict with str keys"),
    ({"cron": "* * * * *", "cron_args": [1, 2]}, "too many positional arguments"),
    ({"cron": "* * * * *", "cron_kwargs": {"week": 1}}, "unexpected keyword argument 'week'"),
    ({"cron": "* * * * *", "cron_args": [dt.date(2025, 1, 1)]}, "can't be encoded as JSON"),
    ({"catch_up": "all"}, "go with a schedule; give its cron=... too"),
    ({"cron_args": 5}, "cron_args=5 without cron=...: cron_tz, catch_up, cron_args and"),
    ({"cron_args": ["day"]}, "cron_args=['day'] without cron=..."),
    ({"cron_kwargs": {}}, "cron_kwargs={} without cron=..."),
    ({"cron": "* * * * *", "cron_args": 5}, "cron_args must be a list or tuple of arguments"),
])
def test_a_bad_schedule_is_refused_when_declared(options, fragment):
    with pytest.raises(InvalidTaskOptions) as caught:
        declare(**options)
    assert fragment in str(caught.value)


def test_a_schedule_without_arguments_needs_a_function_that_takes_none():
    def needs_one(order_id: int) -> None: ...

    with pytest.raises(InvalidTaskOptions, match="missing a required argument: 'order_id'"):
        queue_task(cron="@daily", name="tests.declared.needs_one")(needs_one)


def test_a_good_schedule_is_kept_on_the_task_with_its_zone(settings):
    task = declare(cron="0 3 * * mon-fri", cron_kwargs={"period": "week"},
                   catch_up="latest")
    assert task.schedule is not None
    assert (task.schedule.cron, task.schedule.tz, task.schedule.catch_up) == (
        "0 3 * * mon-fri", settings.TIME_ZONE, "latest")
    assert task.schedule.kwargs == {"period": "week"}


@pytest.mark.parametrize("options, fragment", [
    ({"concurrency_limit": 1}, "concurrency_limit=1"),
    ({"concurrency_limit": 2, "concurrency_key": "period"}, "concurrency_limit=2"),
    ({"ordered_by": "period"}, "ordered_by='period'"),
    ({"unique_for": 0}, "unique_for=0"),
    ({"unique_for": 300}, "unique_for=300"),
])
def test_a_schedule_of_a_gated_or_unique_task_is_refused_when_declared(options, fragment):
    """A schedule's occurrences are inserted ready from its row, with no gate and no dedup
    key: ``cron='* * * * *', concurrency_limit=1`` runs that outlast a minute overlapped."""
    with pytest.raises(InvalidTaskOptions) as caught:
        declare(cron="* * * * *", **options)
    message = str(caught.value)
    assert f"can't be combined with {fragment}" in message
    assert "whose body calls tests.declared." in message and ".enqueue(" in message
    declare(**options)  # without cron=...: as before


# ------------------------------------------------------------ MYSQLQ['SCHEDULES']

@pytest.mark.parametrize("schedules, fragment", [
    ([], "must be a dict of schedule name"),
    ({"r": "0 3 * * *"}, "must be a dict with 'task' and 'cron'"),
    ({"r": {"task": "t"}}, "missing cron"),
    ({"r": {"task": "t", "cron": "* * * * *", "when": 1}}, "unknown key(s) when"),
    ({"r": {"task": "t", "cron": "not cron"}}, "is not a valid cron expression"),
    ({"r": {"task": "t", "cron": "* * * * *", "tz": "Nowhere"}}, "'tz' 'Nowhere' is not"),
    ({"r": {"task": "t", "cron": "* * * * *", "catch_up": "x"}}, "catch_up must be one of"),
    ({"r": {"task": "t", "cron": "* * * * *", "args": [{1, 2}]}}, "can't be encoded as JSON"),
    ({"r": {"task": 5, "cron": "* * * * *"}}, "must be a registered task's name"),
])
def test_bad_settings_schedules_are_E001(settings, schedules, fragment):
    settings.MYSQLQ = {"SCHEDULES": schedules}
    [error] = check_settings()
    assert error.id == "django_mysqlq.E001"
    assert fragment in error.msg


def test_a_settings_schedule_of_an_unknown_task_is_E006(settings):
    settings.MYSQLQ = {"SCHEDULES": {"nightly": {"task": "shop.tasks.nope",
                                                 "cron": "0 3 * * *"}}}
    [error] = check_schedules()
    assert error.id == "django_mysqlq.E006"
    assert "'shop.tasks.nope', which is not registered" in error.msg


@pytest.mark.parametrize("task, fragment", [
    ("limited_step", "concurrency_limit="), ("ordered_step", "ordered_by='key'"),
    ("unique_step", "unique_for="), ("unique_while_queued", "unique_for=0"),
])
def test_a_settings_schedule_of_a_gated_or_unique_task_is_E006(settings, task, fragment):
    from tests.testapp import gated, unique_tasks

    declared_task = getattr(gated, task, None) or getattr(unique_tasks, task)
    settings.MYSQLQ = {"SCHEDULES": {"often": {"task": declared_task.name,
                                               "cron": "* * * * *", "args": ["k", 1, "x"]
                                               if task != "unique_while_queued" else ["k"]}}}
    [error] = check_schedules()
    assert error.id == "django_mysqlq.E006"
    assert f"MYSQLQ['SCHEDULES']['often'] names {declared_task.name!r}, which has " \
        f"{fragment}" in error.msg
    assert "Schedule a task without it whose body calls" in error.msg


def test_settings_schedule_arguments_are_checked_against_the_task_E006(settings):
    from tests.testapp import cron_tasks

    settings.MYSQLQ = {"SCHEDULES": {"ticks": {"task": cron_tasks.tick.name,
                                               "cron": "0 3 * * *", "args": [1, 2, 3]}}}
    [error] = check_schedules()
    assert "its 'args' and 'kwargs' don't fit the task" in error.msg
    assert "too many positional arguments" in error.msg


def test_a_settings_schedule_may_not_take_a_cron_task_name(settings):
    from tests.testapp import cron_tasks

    settings.MYSQLQ = {"SCHEDULES": {cron_tasks.every_second.name: {
        "task": cron_tasks.tick.name, "cron": "0 3 * * *"}}}
    [error] = check_schedules()
    assert "declares cron=... itself" in error.msg


def test_good_settings_schedules_are_declared_with_their_task(settings):
    from tests.testapp import cron_tasks

    settings.MYSQLQ = {"SCHEDULES": {"nightly": {
        "task": cron_tasks.tick.name, "cron": "0 3 * * *", "tz": "Europe/Paris",
        "catch_up": "latest", "kwargs": {"label": "nightly"}}}}
    assert check_schedules() == []
    assert check_settings() == []
    [row] = [row for row in declared() if row.name == "nightly"]
    assert (row.source, row.task_name, row.queue, row.cron, row.timezone, row.catch_up) == (
        "settings", cron_tasks.tick.name, "cron", "0 3 * * *", "Europe/Paris", "latest")
    assert row.payload == '{"args":[],"kwargs":{"label":"nightly"}}'


def test_settings_schedule_arguments_over_the_payload_limit_are_E006(settings):
    from tests.testapp import cron_tasks

    settings.MYSQLQ = {"MAX_PAYLOAD_BYTES": 100, "SCHEDULES": {"big": {
        "task": cron_tasks.tick.name, "cron": "0 3 * * *", "args": ["x" * 200]}}}
    [error] = check_schedules()
    assert "MYSQLQ['SCHEDULES']['big']: The arguments of task" in error.msg
    assert "over MYSQLQ['MAX_PAYLOAD_BYTES'] (100)" in error.msg


def test_a_year_field_is_refused_and_an_expression_that_runs_out_is_a_cron_error():
    """croniter takes a seventh field, a year. Such a schedule passed the check (it fires
    after 2000) and, once past its year, croniter raised outside CronError at every
    upkeep round of every worker: they stopped, and again at each restart."""
    problem = cron.expression_problem("0 9 1 1 * 0 2025")
    assert problem is not None and "has 7 fields" in problem and "year" in problem
    from zoneinfo import ZoneInfo

    stored = Cron("0 9 1 1 * 0 2025", ZoneInfo("UTC"), False)  # stored by hand
    with pytest.raises(cron.CronError, match="never fires again"):
        stored.after(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert cron.expression_problem("0 9 1 1 * 0") is None  # six: seconds last
    assert cron.expression_problem("@daily") is None
