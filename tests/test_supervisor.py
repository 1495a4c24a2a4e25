"""``runqueueworker --processes``: real forked children, real signals."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time

import pytest

from django_mysqlq.models import Attempt, Message, Worker
from django_mysqlq.worker.draining import EXIT_DEAD, EXIT_TIMEOUT
from django_mysqlq.worker.options import WorkerOptions
from django_mysqlq.worker.supervisor import Child, Supervisor
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PATIENCE = 20.0


def live_children(supervisor) -> set[int]:
    """Pids of registered, running workers other than the supervisor itself."""
    return {pid for pid in Worker.objects.running().values_list("pid", flat=True)
            if pid != supervisor.pid and _alive(pid)}


def summary_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Summary: ")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_child_is_replaced_and_sigterm_drains_them_all(start_worker):
    supervisor = start_worker("--processes", "2", "--concurrency", "2")
    first = wait_for(lambda: (c := live_children(supervisor)) and len(c) == 2 and c,
                     PATIENCE, message="two children to register")
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(live_children(supervisor) - first) == 1 and
             len(live_children(supervisor)) == 2, PATIENCE, message="a replacement child")
    handles = tasks.record.enqueue_many([[f"m{i}"] for i in range(10)])
    wait_for(lambda: not Message.objects.filter(pk__in=[h.id for h in handles]).exists(),
             PATIENCE, message="the children to process the messages")
    assert "killed by SIGKILL; replacing it" in supervisor.output()
    children = live_children(supervisor)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(PATIENCE) == 0, supervisor.output()
    assert not any(_alive(pid) for pid in children)
    assert Worker.objects.running().filter(pid__in=children).count() == 0


def test_children_are_recycled_after_max_tasks(start_worker):
    supervisor = start_worker("--processes", "1", "--max-tasks", "3", "--batch", "1")
    handles = tasks.record.enqueue_many([[f"m{i}"] for i in range(7)])
    wait_for(lambda: Attempt.objects.succeeded().count() == 7, PATIENCE,
             message="all seven messages")
    pids = set(Ledger.objects.values_list("pid", flat=True))
    assert len(pids) == 3  # 3 + 3 + 1
    assert supervisor.pid not in pids
    assert "was recycled" in supervisor.output()
    assert all(h.status == "succeeded" for h in handles)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(PATIENCE) == 0, supervisor.output()
    lines = summary_lines(supervisor.output())  # the recycled children's work included
    assert len(lines) == 1 and lines[0].startswith("Summary: processed=7 succeeded=7 "), lines


def test_a_child_over_max_memory_is_replaced_after_its_task(start_worker):
    supervisor = start_worker("--processes", "1", "--max-memory", "1", "--batch", "1")
    tasks.record.enqueue_many([["a"], ["b"], ["c"]])
    wait_for(lambda: Attempt.objects.succeeded().count() == 3, PATIENCE,
             message="three messages")
    assert len(set(Ledger.objects.values_list("pid", flat=True))) == 3
    assert "over --max-memory 1" in supervisor.output()


def test_a_task_past_its_timeout_kills_its_child_and_is_retried(start_worker):
    supervisor = start_worker("--processes", "1")
    handle = tasks.hangs.enqueue("h")
    other = tasks.record.enqueue("still-runs")
    wait_for(lambda: Message.objects.filter(pk=handle.id, status="dead").exists(), PATIENCE,
             message="the hanging message to fail twice and go dead")
    attempts = list(Attempt.objects.for_message(handle.id))
    assert [a.outcome for a in attempts] == ["retried", "failed"]
    assert all(a.error_class == "django_mysqlq.exceptions.TaskTimeout" for a in attempts)
    assert "past its timeout" in attempts[0].error_message
    starts = list(Ledger.objects.filter(label="h:start").values_list("pid", flat=True))
    assert len(starts) == 2 and starts[0] != starts[1]  # each attempt in a fresh process
    wait_for(lambda: other.state().status == "succeeded", PATIENCE,
             message="the other message to run")
    assert "ended after a task ran past its timeout" in supervisor.output()
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(PATIENCE) == 0, supervisor.output()


def finished_rows(message_id: int) -> list[tuple[str, int | None]]:
    """The ``task_finished`` signals of ``tasks.sleeps_past_timeout`` (tests/testapp)."""
    return list(Ledger.objects.filter(label__startswith=f"sleeper:finished:{message_id}:")
                .order_by("id").values_list("label", "value"))


def test_a_task_past_its_timeout_in_a_child_sends_task_finished(start_worker):
    # As any failed attempt does: its outcome, its TaskTimeout, sent inside a handler of
    # that error (sys.exc_info()), once per attempt, by the child that ran it.
    supervisor = start_worker("--processes", "1")
    handle = tasks.sleeps_past_timeout.enqueue("ov")
    wait_for(lambda: len(finished_rows(handle.id)) == 2, PATIENCE,
             message="both attempts' task_finished")
    prefix = f"sleeper:finished:{handle.id}"
    assert finished_rows(handle.id) == [(f"{prefix}:retried:TaskTimeout:TaskTimeout", 1),
                                        (f"{prefix}:failed:TaskTimeout:TaskTimeout", 2)]
    starts = list(Ledger.objects.filter(label="ov:start").values_list("pid", flat=True))
    signalled = list(Ledger.objects.filter(label__startswith=prefix).order_by("id")
                     .values_list("pid", flat=True))
    assert signalled == starts and len(set(starts)) == 2, supervisor.output()
    assert Message.objects.get(pk=handle.id).status == "dead"
    wait_for(lambda: supervisor.output().count("ran past its timeout; replacing it") == 2,
             PATIENCE, message="the second child to be replaced")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(PATIENCE) == 0, supervisor.output()


def test_a_child_ended_by_a_timeout_is_replaced_at_once(start_worker):
    # Each attempt ends its child within a second or two of its start: a deliberate exit,
    # not a crash loop, so the next child starts at once (it waited 1 s, then 2 s).
    handle = tasks.sleeps_past_timeout.enqueue("ov")
    supervisor = start_worker("--burst", "--burst-wait", "1", "--processes", "1")
    status = supervisor.wait(60)
    output = supervisor.output()
    assert status == EXIT_DEAD, output
    assert Message.objects.get(pk=handle.id).status == "dead", output
    lines = [line for line in output.splitlines() if "ran past its timeout; replacing" in line]
    assert len(lines) == 2, output
    assert all(line.endswith(" ended after a task ran past its timeout; replacing it.")
               for line in lines), output
    assert "died quickly" not in output


def _ended(supervisor: Supervisor, status: int, caplog: pytest.LogCaptureFixture) -> str:
    """What the supervisor says of a child that ended ``status`` just after its start;
    its slot's next child may start at once only if it says no delay."""
    caplog.clear()
    supervisor._replace(Child(slot=0, pid=4242, started=time.monotonic(), report_fd=-1),
                        status)
    [message] = caplog.messages
    at_once = supervisor._not_before[0] <= time.monotonic()
    assert at_once == message.endswith("replacing it."), message
    return message.removeprefix("Worker process 4242 ")


def test_timeouts_are_replaced_at_once_and_a_crash_loop_still_backs_off(caplog):
    caplog.set_level(logging.INFO, logger="django_mysqlq")
    supervisor = Supervisor(WorkerOptions(queues=("default",)), 1)
    crashed, killed, timed_out = 1 << 8, signal.SIGKILL, EXIT_TIMEOUT << 8
    assert _ended(supervisor, crashed, caplog) == \
        "exited with status 1; replacing it in 1.0s (it died quickly)."
    assert _ended(supervisor, killed, caplog) == \
        "killed by SIGKILL; replacing it in 2.0s (it died quickly)."
    for _ in range(3):
        assert _ended(supervisor, timed_out, caplog) == \
            "ended after a task ran past its timeout; replacing it."
    # A crash after that starts the pauses over; they grow again while it lasts.
    assert _ended(supervisor, crashed, caplog).endswith(" in 1.0s (it died quickly).")
    assert _ended(supervisor, crashed, caplog).endswith(" in 2.0s (it died quickly).")
    assert _ended(supervisor, killed, caplog).endswith(" in 4.0s (it died quickly).")
    assert supervisor.restarts == 8


def test_a_second_signal_makes_children_exit_at_once(start_worker):
    supervisor = start_worker("--processes", "2")
    wait_for(lambda: len(live_children(supervisor)) == 2, PATIENCE, message="children")
    handle = tasks.slow.enqueue("long", 30)
    wait_for(lambda: Ledger.objects.filter(label="long:start").exists(), PATIENCE,
             message="the slow task to start")
    supervisor.signal(signal.SIGTERM)
    wait_for(lambda: "draining" in supervisor.output(), PATIENCE, message="the first signal")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(PATIENCE) == 1
    assert Message.objects.get(pk=handle.id).status == "claimed"  # for a peer to recover
    assert not Ledger.objects.filter(label="long:end").exists()


def test_children_drain_and_exit_when_the_supervisor_is_killed(start_worker):
    supervisor = start_worker("--processes", "2")
    children = wait_for(lambda: (c := live_children(supervisor)) and len(c) == 2 and c,
                        PATIENCE, message="two children")
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait(PATIENCE)
    wait_for(lambda: not any(_alive(pid) for pid in children), PATIENCE,
             message="the orphaned children to exit")
    # They stopped gracefully (deregistered), not by being killed.
    assert Worker.objects.filter(pid__in=children, stopped_at__isnull=False).count() == 2


def test_a_stopped_supervisor_prints_one_summary_of_its_childrens_work(start_worker):
    supervisor = start_worker("--processes", "2", "--batch", "1")
    wait_for(lambda: len(live_children(supervisor)) == 2, PATIENCE, message="children")
    tasks.slow.enqueue_many([[f"m{i}", 0.2] for i in range(8)])
    tasks.fails_verbosely.enqueue_many([[1], [2]])  # one attempt each: dead
    wait_for(lambda: Attempt.objects.count() == 10, PATIENCE, message="ten attempts")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(PATIENCE) == 0, supervisor.output()  # deaths: no --burst
    output = supervisor.output()
    assert len(summary_lines(output)) == 1, output
    line = summary_lines(output)[0]
    assert line.startswith("Summary: processed=10 succeeded=8 unacked=0 failed=2 retried=0 "
                           "dead=2 recovered=0 released=0 deferred=0 lost=0 skipped=0 "
                           "deadlocks="), output
    assert "/s in " in line
    # The sum of the lines the children logged of their own (on stderr).
    own = re.findall(r"Worker \S+ stopped: processed=(\d+) ", output)
    assert len(own) == 2 and sum(map(int, own)) == 10, output


def test_a_burst_supervisor_prints_its_summary_as_json(start_worker):
    tasks.record.enqueue_many([[f"m{i}"] for i in range(5)])
    supervisor = start_worker("--burst", "--burst-wait", "1", "--processes", "2",
                              "--json-summary")
    assert supervisor.wait(60) == 0, supervisor.output()
    found = json.loads(next(line for line in supervisor.output().splitlines()
                            if line.startswith("{")))
    assert list(found) == ["processed", "succeeded", "unacked", "failed", "retried", "dead",
                           "recovered", "deferred", "lost", "skipped", "released",
                           "deadlocks_retried", "lock_waits_retried", "db_errors", "seconds",
                           "rate"]
    assert (found["processed"], found["succeeded"], found["dead"]) == (5, 5, 0)
