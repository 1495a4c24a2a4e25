"""A worker stopping (SIGTERM) with a broadcast handler running: the handler finishes
(the drain waits for the reader, within a bound), and no broadcast handler starts after
the signal, for messages read before it or published after it. Before, the reader went
on through every topic's batch after the signal, and the process exit killed the running
handler (a daemon thread) mid-way."""

from __future__ import annotations

import signal

from django_mysqlq.worker.draining import BROADCAST_FINISH_SECONDS
from tests.conftest import wait_for
from tests.testapp.models import GateRun
from tests.testapp.slow_broadcast_handlers import slowcast

ENV = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.slow_broadcast_handlers"}
#: The running handler's length: well within BROADCAST_FINISH_SECONDS.
SLOW = 2.0


def edges(pid: int) -> set[tuple[int, str]]:
    return set(GateRun.objects.filter(label="slowcast", pid=pid).values_list("seq", "edge"))


def test_a_stop_lets_the_running_broadcast_handler_finish_and_starts_no_other(
        start_worker) -> None:
    assert SLOW < BROADCAST_FINISH_SECONDS
    worker = start_worker("--queues", "default", env=ENV)
    wait_for(lambda: "started: queues=" in worker.output(), timeout=60,
             message="the worker to start")
    # Read in one batch: 1 and 2 wait behind 0 when the signal comes.
    slowcast.publish_many([{"seq": seq, "sleep": SLOW if seq == 0 else 0}
                           for seq in range(3)])
    wait_for(lambda: (0, "start") in edges(worker.pid), timeout=60,
             message="the slow handler to start")
    worker.signal(signal.SIGTERM)
    slowcast.publish_many([{"seq": seq, "sleep": 0} for seq in range(3, 6)])
    assert worker.wait(timeout=30) == 0, worker.output()
    assert edges(worker.pid) == {(0, "start"), (0, "end")}, worker.output()


def test_a_stop_cuts_off_a_broadcast_handler_past_the_bound_and_says_so(start_worker) -> None:
    """A handler still running BROADCAST_FINISH_SECONDS after the signal does not hold the
    stop: the worker logs that it cuts it off and exits (it never ends the handler)."""
    worker = start_worker("--queues", "default", env=ENV)
    wait_for(lambda: "started: queues=" in worker.output(), timeout=60,
             message="the worker to start")
    slowcast.publish({"seq": 0, "sleep": 120})
    wait_for(lambda: (0, "start") in edges(worker.pid), timeout=60,
             message="the slow handler to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=BROADCAST_FINISH_SECONDS + 25) == 0, worker.output()
    assert "A broadcast handler was still running 5s after the stop; exiting anyway" \
        in worker.output()
    assert edges(worker.pid) == {(0, "start")}, worker.output()
