"""Recurring tasks with real worker processes on the real MariaDB: two and three workers
racing for every occurrence, a downtime caught up by each policy, a parked worker waking
for an occurrence, pause and resume while workers run, a row broken under a worker."""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
from collections import Counter

import pytest
from django.core.management import call_command
from django.db import connection

from django_mysqlq import broker, recurring
from django_mysqlq.models import Attempt, Message, Schedule, Worker
from tests.conftest import wait_for
from tests.testapp import cron_tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

CRON_MODULE = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.cron_tasks"}
EVERY_SECOND = cron_tasks.every_second.name
#: Workers that leave the schedules' messages ready: the test counts them.
NOT_CRON = ("--queues", "default")


def occurrences(task_name: str) -> list[dt.datetime]:
    return list(Message.objects.filter(task_name=task_name).order_by("run_at")
                .values_list("run_at", flat=True))


def stop(*workers) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT UTC_TIMESTAMP(6)")
        return cursor.fetchone()[0].replace(tzinfo=dt.UTC)


@pytest.mark.parametrize("count", [2, 3])
def test_racing_workers_enqueue_each_occurrence_exactly_once(start_worker, count):
    workers = [start_worker(*NOT_CRON, "--concurrency", "2", env=CRON_MODULE)
               for _ in range(count)]
    wait_for(lambda: len(occurrences(EVERY_SECOND)) >= 7, 40,
             message="seven occurrences of the every-second schedule")
    stop(*workers)
    for task_name, step in ((EVERY_SECOND, 1), (cron_tasks.every_two_seconds.name, 2)):
        times = occurrences(task_name)
        assert len(times) == len(set(times)), Counter(times).most_common(3)
        # None lost either while the workers ran: one message per occurrence, no gap.
        assert times == [times[0] + dt.timedelta(seconds=step * n) for n in range(len(times))]
    # Every worker took part in the checks: each fired some, none fired one twice.
    logs = [worker.output() for worker in workers]
    enqueued = [line for log in logs for line in log.splitlines()
                if f"Schedule '{EVERY_SECOND}': enqueued" in line]
    assert len(enqueued) == len(occurrences(EVERY_SECOND))
    # Counted from history too: drain them with the schedules paused (no new ones).
    call_command("queueschedule", "pause", EVERY_SECOND, cron_tasks.every_two_seconds.name)
    ran = len(occurrences(EVERY_SECOND))
    drain = start_worker("--queues", "cron", "--burst", env=CRON_MODULE)
    assert drain.wait(60) == 0, drain.output()
    assert Attempt.objects.filter(task_name=EVERY_SECOND, outcome="succeeded").count() == ran
    assert Ledger.objects.filter(label="every-second").count() == ran
    assert Counter(Attempt.objects.filter(task_name=EVERY_SECOND)
                   .values_list("message_id", flat=True)).most_common(1)[0][1] == 1


def hourly_away_from_now() -> tuple[str, int]:
    """An hourly expression whose occurrences are all at least 25 minutes from now, so none
    is on time or falls due while the test runs."""
    minute = (db_now().minute + 30) % 60
    return f"{minute} * * * *", minute


def test_a_downtime_is_caught_up_by_each_policy(start_worker, settings):
    expression, minute = hourly_away_from_now()
    policies = {"skip": "skip", "latest": "latest", "all": "all", "all-bounded": "all"}
    schedules = {name: {"task": cron_tasks.tick.name, "cron": expression, "tz": "UTC",
                        "catch_up": policy, "args": [name]}
                 for name, policy in policies.items()}
    settings.MYSQLQ = {**settings.MYSQLQ, "SCHEDULES": schedules}
    broker.sync_schedules(recurring.declared())  # as a worker that ran before would have
    latest = db_now().replace(minute=minute, second=0, microsecond=0)
    if latest > db_now():
        latest -= dt.timedelta(hours=1)
    # No worker for ten hours (2,000 for the bounded one), as the rows show it.
    long_ago = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    Schedule.objects.filter(name__in=["skip", "latest", "all"]).update(
        next_run_at=latest - dt.timedelta(hours=10), created_at=long_ago)
    Schedule.objects.filter(name="all-bounded").update(
        next_run_at=latest - dt.timedelta(hours=2000), created_at=long_ago)

    worker = start_worker(*NOT_CRON, env={**CRON_MODULE,
                                          "MYSQLQ_TEST_SCHEDULES": json.dumps(schedules)})
    wait_for(lambda: Schedule.objects.filter(name__in=policies,
                                             next_run_at__gt=db_now()).count() == 4,
             60, message="every schedule to move past now")
    stop(worker)

    def runs(name: str) -> list[dt.datetime]:
        return list(Message.objects.filter(task_name=cron_tasks.tick.name,
                                           payload__contains=f'"{name}"').order_by("run_at")
                    .values_list("run_at", flat=True))

    assert runs("skip") == []
    assert runs("latest") == [latest]
    assert runs("all") == [latest - dt.timedelta(hours=h) for h in range(10, -1, -1)]
    bounded = runs("all-bounded")
    assert len(bounded) == 1000 and bounded[-1] == latest
    assert bounded[0] == latest - dt.timedelta(hours=999)
    for name in policies:
        row = Schedule.objects.get(name=name)
        assert row.next_run_at == latest + dt.timedelta(hours=1)
        assert row.last_run_at == (None if name == "skip" else latest)
    log = worker.output()
    assert "Schedule 'skip' missed 11 occurrence(s) from" in log
    assert "catch_up='skip': none of them enqueued." in log
    assert "catch_up='latest': only the most recent one enqueued." in log
    assert "catch_up='all': all of them enqueued now." in log
    assert ("Schedule 'all-bounded' missed more than 1000 occurrence(s)" in log
            and "catch_up='all': the most recent 1000 enqueued, older ones dropped." in log)


SLOW_UPKEEP = {"MYSQLQ_TEST_HEARTBEAT": "30", "MYSQLQ_TEST_LEASE": "90",
               "MYSQLQ_TEST_RECOVERY": "30"}


def test_a_parked_worker_wakes_for_the_next_occurrence(start_worker):
    """Every duty of the worker 30 s apart: only the schedule can end its park sooner.

    The schedule fires every 5 s, and the occurrence checked is the first one due once the
    worker parks with nothing else to wait for: a one-off occurrence set a few seconds
    ahead would pass, on a loaded machine, before the worker had started to sync it."""
    schedules = {"fives": {"task": cron_tasks.tick.name, "tz": "UTC", "args": ["fives"],
                           "cron": "* * * * * */5"}}
    worker = start_worker("--queues", "default", env={
        **SLOW_UPKEEP, **CRON_MODULE, "MYSQLQ_TEST_SCHEDULES": json.dumps(schedules)})
    wait_for(lambda: Worker.objects.filter(pid=worker.pid, listening=True).exists(), 60,
             message="the worker to park")
    Schedule.objects.exclude(name="fives").update(paused=True)  # the every-second ones
    # The park under way ends at the next second; the one after waits for "fives" alone.
    after = (db_now() + dt.timedelta(seconds=2)).replace(microsecond=0)
    occurrence = after + dt.timedelta(seconds=5 - after.second % 5)
    fired = Message.objects.filter(task_name=cron_tasks.tick.name, payload__contains='"fives"',
                                   run_at=occurrence)
    wait_for(fired.exists, 40, message=f"the occurrence of {occurrence} to be enqueued")
    # Enqueued as its time came, not at the end of a 30 s park.
    assert fired.get().enqueued_at - occurrence < dt.timedelta(seconds=5)
    assert Schedule.objects.get(name="fives").last_run_at >= occurrence
    stop(worker)


def test_pause_and_resume_while_workers_run(start_worker):
    workers = [start_worker(*NOT_CRON, env=CRON_MODULE) for _ in range(2)]
    wait_for(lambda: len(occurrences(EVERY_SECOND)) >= 2, 30, message="two occurrences")
    call_command("queueschedule", "pause", EVERY_SECOND)
    paused_at, count = db_now(), len(occurrences(EVERY_SECOND))
    time.sleep(3)
    assert len(occurrences(EVERY_SECOND)) == count  # nothing while paused
    assert occurrences(cron_tasks.every_two_seconds.name)[-1] > paused_at  # others go on
    # Read before the resume: the first occurrence after it (the next whole second) may
    # be earlier than a read taken after it.
    resumed_at = db_now()
    call_command("queueschedule", "resume", EVERY_SECOND)
    wait_for(lambda: len(occurrences(EVERY_SECOND)) >= count + 2, 30,
             message="occurrences after the resume")
    stop(*workers)
    times = occurrences(EVERY_SECOND)
    # The paused seconds were not caught up: a gap from the pause to the resume.
    assert not [t for t in times if paused_at + dt.timedelta(seconds=1) < t < resumed_at]
    row = Schedule.objects.get(name=EVERY_SECOND)
    assert not row.paused and row.changed_by.startswith("cli:")


def test_a_row_broken_under_running_workers_stops_only_that_schedule(start_worker):
    first = start_worker(*NOT_CRON, env=CRON_MODULE)
    wait_for(lambda: occurrences(EVERY_SECOND), 30, message="a first occurrence")
    Schedule.objects.filter(name=EVERY_SECOND).update(cron="every second please")
    wait_for(lambda: Schedule.objects.get(name=EVERY_SECOND).error, 20,
             message="the worker to mark the row broken")
    broke_at, count = db_now(), len(occurrences(EVERY_SECOND))
    two = cron_tasks.every_two_seconds.name
    wait_for(lambda: occurrences(two) and occurrences(two)[-1] > broke_at, 20,
             message="the other schedule to go on")
    assert len(occurrences(EVERY_SECOND)) == count
    assert "Schedule 'tests.every_second' can't fire" in first.output()
    # A worker that starts writes the code's declaration again: it fires from now on.
    second = start_worker(*NOT_CRON, env=CRON_MODULE)
    wait_for(lambda: len(occurrences(EVERY_SECOND)) > count, 30,
             message="the repaired schedule to fire")
    row = Schedule.objects.get(name=EVERY_SECOND)
    assert (row.cron, row.error) == ("* * * * * *", "")
    Schedule.objects.filter(name=EVERY_SECOND).update(next_run_at=None)
    wait_for(lambda: Schedule.objects.get(name=EVERY_SECOND).next_run_at, 20,
             message="a wiped next run time to be repaired")
    stop(first, second)
    times = occurrences(EVERY_SECOND)
    assert len(times) == len(set(times))


def test_a_worker_whose_code_lacks_a_schedule_marks_it_removed(start_worker):
    with_cron = start_worker(*NOT_CRON, env=CRON_MODULE)
    wait_for(lambda: Schedule.objects.filter(name=EVERY_SECOND).exists(), 30,
             message="the schedule rows")
    stop(with_cron)
    without = start_worker(*NOT_CRON)
    wait_for(lambda: Schedule.objects.filter(removed_at__isnull=False).count() == 2, 30,
             message="the rows marked removed")
    count = len(occurrences(EVERY_SECOND))
    time.sleep(2)
    assert len(occurrences(EVERY_SECOND)) == count  # removed: no longer fired
    stop(without)
    assert "are not declared by this worker's code or settings" in without.output()
    call_command("queueschedule", "prune")
    assert not Schedule.objects.exists()


def test_a_worker_refuses_to_start_on_a_settings_schedule_it_can_not_write(start_worker):
    schedules = {"bad": {"task": "shop.tasks.nope", "cron": "0 3 * * *"}}
    worker = start_worker(env={"MYSQLQ_TEST_SCHEDULES": json.dumps(schedules)})
    assert worker.wait(30) != 0
    output = worker.output()
    assert "django_mysqlq.E006" in output and "'shop.tasks.nope', which is not" in output
    assert "Traceback" not in output
