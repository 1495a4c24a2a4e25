"""Stop signals as a supervisor, its children and a lone worker hear them.

A process manager, a terminal or an operator may signal the whole process group (Ctrl-C,
``kill -TERM -<pgid>``, systemd's ``KillMode=control-group``, supervisord's
``stopasgroup``), the supervisor alone, or one child; a terminal that goes away sends
SIGHUP. Whatever the route, one stop drains, and only a second one heard exits at once;
a stop the worker began on its own (``--max-memory``) is not one heard. Real processes,
real signals.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from django_mysqlq.models import Attempt, Worker
from tests.conftest import raw_connection, wait_for
from tests.test_supervisor import _alive, live_children
from tests.test_worker_signals import rows, started, wait_exit
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PATIENCE = 20.0
#: How long the task of a stop test runs: well past the moment the signal is sent, well
#: within the tests' GRACE_SECONDS (10).
TASK_SECONDS = 5


def two_children(supervisor) -> set[int]:
    return wait_for(lambda: (c := live_children(supervisor)) and len(c) == 2 and c,
                    PATIENCE, message="two children to register")


def test_a_stop_sent_to_the_whole_process_group_drains_the_children(start_worker):
    """The group's SIGTERM reaches every child, and then the supervisor's drain request:
    that must not count as a second signal."""
    supervisor = start_worker("--processes", "2")
    children = two_children(supervisor)
    handle = tasks.slow.enqueue("group", TASK_SECONDS)
    wait_for(lambda: started(["group"]), PATIENCE, message="the task to start")
    os.killpg(supervisor.pid, signal.SIGTERM)  # (start_worker gives it a session of its own)
    assert wait_exit(supervisor, PATIENCE + TASK_SECONDS) == 0, supervisor.output()
    output = supervisor.output()
    assert "exiting now" not in output
    assert output.count("stopped (exited with status 0)") == 2, output
    assert rows("group:end")  # the task ran to its end
    assert [a.outcome for a in Attempt.objects.for_message(handle.id)] == ["succeeded"]
    assert not any(_alive(pid) for pid in children)
    assert Worker.objects.filter(pid__in=children, stopped_at__isnull=False).count() == 2


def test_a_child_that_heard_the_stop_itself_is_not_forced_by_the_supervisors(start_worker):
    """The group's stop as it happens when the child's handler runs first: the
    supervisor's request to drain then is the same stop, not a second one."""
    supervisor = start_worker("--processes", "1")
    child = wait_for(lambda: (c := live_children(supervisor)) and len(c) == 1 and c,
                     PATIENCE, message="a child to register").pop()
    handle = tasks.slow.enqueue("heard", TASK_SECONDS)
    wait_for(lambda: started(["heard"]), PATIENCE, message="the task to start")
    os.kill(child, signal.SIGTERM)
    wait_for(lambda: "SIGTERM received: no new claims" in supervisor.output(), PATIENCE,
             message="the child to start draining")
    supervisor.signal(signal.SIGTERM)
    assert wait_exit(supervisor, PATIENCE + TASK_SECONDS) == 0, supervisor.output()
    assert "exiting now" not in supervisor.output()
    assert f"Worker process {child} stopped (exited with status 0)" in supervisor.output()
    assert [a.outcome for a in Attempt.objects.for_message(handle.id)] == ["succeeded"]


def test_a_direct_sigterm_drains_one_child_and_a_second_exits_it_at_once(start_worker,
                                                                         tmp_path):
    supervisor = start_worker("--processes", "1", "--concurrency", "2")
    child = wait_for(lambda: (c := live_children(supervisor)) and len(c) == 1 and c,
                     PATIENCE, message="a child to register").pop()
    # "cut" runs until the gate opens: the replacement child may recover and run it again
    # before the supervisor's stop (it did on a fast machine, past the grace period).
    gate = tmp_path / "gate"
    tasks.slow.enqueue("drained", TASK_SECONDS)
    tasks.slow_until_opened.enqueue("cut", str(gate))
    wait_for(lambda: started(["drained", "cut"]) == {"drained", "cut"}, PATIENCE,
             message="both tasks to start")
    os.kill(child, signal.SIGTERM)
    wait_for(lambda: "SIGTERM received: no new claims" in supervisor.output(), PATIENCE,
             message="the child to start draining")
    wait_for(lambda: rows("drained:end"), PATIENCE, message="the drained task to finish")
    assert _alive(child)  # still waiting for the other task
    os.kill(child, signal.SIGTERM)
    wait_for(lambda: f"Worker process {child} exited with status 1; replacing it"
             in supervisor.output(), PATIENCE, message="the child to exit at once")
    assert "Second SIGTERM: exiting now" in supervisor.output()
    assert not rows("cut:end")
    gate.touch()  # a re-run of "cut" by the replacement ends at once
    supervisor.signal(signal.SIGTERM)
    assert wait_exit(supervisor, PATIENCE) == 0, supervisor.output()


def waiting_for_the_lock(cursor) -> bool:
    cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
                   " AND STATE = 'Waiting for table metadata lock'")
    return cursor.fetchone()[0] > 0


def test_a_stop_during_start_up_spawns_no_child_and_ends(start_worker):
    """A SIGTERM while the supervisor reads the queue's state, before any fork: no child
    starts (one would never hear of the stop), and the supervisor exits 0."""
    stranger = raw_connection()
    try:
        cursor = stranger.cursor()
        cursor.execute("LOCK TABLES mysqlq_message WRITE")  # the start-up report waits
        supervisor = start_worker("--processes", "2")
        wait_for(lambda: waiting_for_the_lock(cursor), PATIENCE,
                 message="the supervisor's start-up report to wait for the lock")
        supervisor.signal(signal.SIGTERM)  # (its handler runs once the statement returns)
        cursor.execute("UNLOCK TABLES")
    finally:
        stranger.close()
    assert wait_exit(supervisor, PATIENCE) == 0, supervisor.output()
    assert "Supervisor started worker process" not in supervisor.output()


def test_a_child_killed_by_a_real_time_signal_is_replaced(start_worker):
    supervisor = start_worker("--processes", "1")
    first = wait_for(lambda: live_children(supervisor), PATIENCE, message="a child").pop()
    signum = signal.SIGRTMIN + 6  # no name in signal.Signals
    os.kill(first, signum)
    wait_for(lambda: (c := live_children(supervisor)) and first not in c, PATIENCE,
             message="a replacement child")
    assert f"Worker process {first} killed by signal {signum}; replacing it" \
        in supervisor.output()
    supervisor.signal(signal.SIGTERM)
    assert wait_exit(supervisor, PATIENCE) == 0, supervisor.output()


@pytest.fixture
def hangup_heard():
    """SIGHUP at its default in the workers started (an ignored one, as under nohup, is
    inherited and stays ignored)."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, previous)


def test_sighup_to_the_group_drains_the_supervisor_and_its_children(start_worker,
                                                                     hangup_heard):
    supervisor = start_worker("--processes", "2")
    children = two_children(supervisor)
    handle = tasks.slow.enqueue("hangup", TASK_SECONDS)
    wait_for(lambda: started(["hangup"]), PATIENCE, message="the task to start")
    os.killpg(supervisor.pid, signal.SIGHUP)  # the terminal went away
    assert wait_exit(supervisor, PATIENCE + TASK_SECONDS) == 0, supervisor.output()
    output = supervisor.output()
    assert "SIGHUP received: draining" in output
    assert output.count("stopped (exited with status 0)") == 2, output
    assert [a.outcome for a in Attempt.objects.for_message(handle.id)] == ["succeeded"]
    assert Worker.objects.filter(pid__in=children, stopped_at__isnull=False).count() == 2


def test_sighup_drains_a_single_worker(start_worker, hangup_heard):
    worker = start_worker("--concurrency", "1")
    handle = tasks.slow.enqueue("alone", TASK_SECONDS)
    wait_for(lambda: started(["alone"]), PATIENCE, message="the task to start")
    worker.signal(signal.SIGHUP)
    assert wait_exit(worker, PATIENCE + TASK_SECONDS) == 0, worker.output()
    assert "SIGHUP received: no new claims" in worker.output()
    assert [a.outcome for a in Attempt.objects.for_message(handle.id)] == ["succeeded"]
    assert Worker.objects.get(pid=worker.pid).stopped_at is not None


def test_a_worker_started_under_nohup_keeps_ignoring_sighup(start_worker):
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does
    try:
        worker = start_worker("--concurrency", "1")
    finally:
        signal.signal(signal.SIGHUP, previous)
    wait_for(lambda: " started: " in worker.output(), PATIENCE, message="the worker to start")
    worker.signal(signal.SIGHUP)
    handle = tasks.record.enqueue("after-hangup")
    wait_for(lambda: Attempt.objects.succeeded().filter(message_id=handle.id).exists(),
             PATIENCE, message="the worker to go on working")
    time.sleep(2.0)  # a parked worker would have taken a handled signal by now
    assert worker.popen.poll() is None
    assert "SIGHUP" not in worker.output()
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, PATIENCE) == 0, worker.output()


def test_a_stop_after_a_max_memory_drain_is_the_first_signal_heard(start_worker):
    """--max-memory stops claiming on its own; the first SIGTERM after that still drains."""
    worker = start_worker("--concurrency", "2", "--batch", "1", "--max-memory", "1")
    handle = tasks.slow.enqueue("long", TASK_SECONDS + 3)
    wait_for(lambda: started(["long"]), PATIENCE, message="the long task to start")
    tasks.record.enqueue("short")
    wait_for(lambda: "over --max-memory 1" in worker.output(), PATIENCE,
             message="the worker to drain after the short task")
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, PATIENCE + TASK_SECONDS) == 0, worker.output()
    assert "SIGTERM received while stopping already (max-memory)" in worker.output()
    assert "exiting now" not in worker.output()
    assert [a.outcome for a in Attempt.objects.for_message(handle.id)] == ["succeeded"]
