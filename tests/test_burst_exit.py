"""``--burst`` tells a script what happened: a non-zero exit when messages went dead.

Real ``runqueueworker --burst`` processes, one or under a ``--processes`` supervisor.
"""

from __future__ import annotations

import json

import pytest

from django_mysqlq.models import Message
from django_mysqlq.worker.draining import EXIT_DEAD, EXIT_TIMEOUT
from django_mysqlq.worker.fatal import EXIT_CANNOT_RUN
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_the_exit_statuses_are_distinct():
    # 1: CommandError, a stop that left tasks running; 2: argparse's usage errors.
    assert len({0, 1, 2, EXIT_DEAD, EXIT_TIMEOUT, EXIT_CANNOT_RUN}) == 6


def test_a_burst_run_that_left_a_message_dead_exits_with_exit_dead(start_worker):
    tasks.record.enqueue("fine")
    dead = tasks.fails_verbosely.enqueue(1).id
    worker = start_worker("--burst", "--burst-wait", "1")
    status = worker.wait(timeout=60)
    output = worker.output()
    assert status == EXIT_DEAD, output
    assert (f"1 message(s) went dead during this --burst run; exiting with status {EXIT_DEAD} "
            "(--exit-zero exits 0).") in output
    assert "dead=1 " in output.splitlines()[-1]  # the summary still comes
    assert Message.objects.get(pk=dead).status == "dead"


def test_exit_zero_keeps_status_0(start_worker):
    tasks.fails_verbosely.enqueue(1)
    worker = start_worker("--burst", "--burst-wait", "1", "--exit-zero")
    assert worker.wait(timeout=60) == 0, worker.output()


def test_a_burst_run_without_deaths_exits_0_though_older_messages_are_dead(start_worker):
    old = tasks.fails_verbosely.enqueue(1).id
    first = start_worker("--burst", "--burst-wait", "1")
    assert first.wait(timeout=60) == EXIT_DEAD, first.output()
    tasks.record.enqueue("later")
    second = start_worker("--burst", "--burst-wait", "1")
    assert second.wait(timeout=60) == 0, second.output()  # deaths of earlier runs don't count
    assert Message.objects.get(pk=old).status == "dead"


def test_a_burst_supervisor_exits_exit_dead_if_any_child_saw_a_death(start_worker):
    tasks.record.enqueue_many([[f"r{i}"] for i in range(6)])
    tasks.fails_verbosely.enqueue(1)
    supervisor = start_worker("--burst", "--burst-wait", "1", "--processes", "2")
    status = supervisor.wait(timeout=60)
    output = supervisor.output()
    assert status == EXIT_DEAD, output
    assert "drained its queues; messages went dead meanwhile" in output
    assert "replacing it" not in output  # a child that drained is never replaced
    assert not Message.objects.exclude(status="dead").exists()


def test_a_burst_supervisor_with_exit_zero_exits_0(start_worker):
    tasks.fails_verbosely.enqueue(1)
    supervisor = start_worker("--burst", "--burst-wait", "1", "--processes", "2",
                              "--exit-zero")
    assert supervisor.wait(timeout=60) == 0, supervisor.output()


def test_a_burst_supervisor_exits_exit_dead_when_a_timeout_left_a_message_dead(start_worker):
    # The child whose task overran fails the attempt itself and exits EXIT_TIMEOUT to be
    # replaced: the death still reaches the supervisor's status, and each attempt its line.
    handle = tasks.hangs.enqueue("h")  # timeout 0.3 s, 2 attempts, no backoff
    supervisor = start_worker("--burst", "--burst-wait", "1", "--processes", "1")
    status = supervisor.wait(timeout=60)
    output = supervisor.output()
    assert status == EXIT_DEAD, output
    assert Message.objects.get(pk=handle.id).status == "dead"
    lines = [line for line in output.splitlines() if f"id={handle.id} " in line]
    prefix = f"task=tests.testapp.tasks.hangs id={handle.id} queue=default"
    assert len(lines) == 2, output
    assert f"{prefix} attempt=1/2 outcome=retried duration_ms=" in lines[0]
    assert f"{prefix} attempt=2/2 outcome=failed duration_ms=" in lines[1]
    assert all(" error=django_mysqlq.exceptions.TaskTimeout: ran " in line for line in lines)
    assert "detail=now dead: no attempts left" in lines[1]
    assert (f"1 message(s) went dead during this --burst run; exiting with status {EXIT_DEAD} "
            "(--exit-zero exits 0).") in output


def test_a_burst_supervisor_with_exit_zero_exits_0_after_a_timeout_death(start_worker):
    tasks.hangs.enqueue("h")
    supervisor = start_worker("--burst", "--burst-wait", "1", "--processes", "1",
                              "--exit-zero")
    assert supervisor.wait(timeout=60) == 0, supervisor.output()


def test_a_message_buried_by_recovery_counts_as_dead_for_the_burst(start_worker):
    # A task that kills its process goes dead in the sweep that recovers its last crash,
    # not in a task thread: the child whose sweep buried it counts it, and says so.
    killer = tasks.exits_process.enqueue("k").id  # 2 attempts
    tasks.record.enqueue("fine")
    supervisor = start_worker("--burst", "--burst-wait", "1", "--processes", "1",
                              "--json-summary")
    status = supervisor.wait(timeout=90)
    output = supervisor.output()
    assert status == EXIT_DEAD, output
    assert Message.objects.get(pk=killer).status == "dead"
    assert f"1 recovered message(s) went dead: lost with their worker during their last " \
        f"attempt (WorkerLost): #{killer}" in output
    summary = json.loads(next(line for line in reversed(output.splitlines())
                              if line.startswith("{")))
    assert summary["dead"] == 1, output
    assert "messages went dead meanwhile" in output
