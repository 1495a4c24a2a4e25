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

import pytest

from django_mysqlq.models import Attempt
from tests.conftest import wait_for
from tests.test_supervisor import live_children
from tests.test_worker_signals import started, wait_exit
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PATIENCE = 20.0
#: How long the task of a stop test runs: well past the moment the signal is sent, well
#: within the tests' GRACE_SECONDS (10).
TASK_SECONDS = 5


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
