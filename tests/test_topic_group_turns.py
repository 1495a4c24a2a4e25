"""Groups served by one worker share its room in turn: a group with a backlog (a slow
handler, a flood) does not keep the worker's other groups waiting until it runs dry
(issue 14: a failure in one group never delays another)."""

from __future__ import annotations

import signal

import pytest

from django_mysqlq.worker.queues import in_turn
from tests.conftest import wait_for
from tests.testapp import fair_handlers
from tests.testapp.models import GateRun

GROUPS = {"group:aaa", "group:zzz", "group:mmm"}


def test_groups_rotate_among_their_places_and_task_queues_keep_theirs() -> None:
    queues = ["default", "group:aaa", "reports", "group:mmm", "group:zzz"]
    orders = [in_turn(queues, GROUPS, turn) for turn in range(4)]
    assert orders[0] == queues
    assert orders[1] == ["default", "group:mmm", "reports", "group:zzz", "group:aaa"]
    assert orders[2] == ["default", "group:zzz", "reports", "group:aaa", "group:mmm"]
    assert orders[3] == queues
    # Each group comes first among the groups once in three claims.
    assert {next(q for q in order if q in GROUPS) for order in orders[:3]} == GROUPS
    # A group holding fewer of the worker's claims goes first; ties keep their turn.
    held = {"group:aaa": 6, "group:mmm": 1}
    assert in_turn(queues, GROUPS, 0, held) == [
        "default", "group:zzz", "reports", "group:mmm", "group:aaa"]
    assert in_turn(queues, GROUPS, 1, {"group:mmm": 2}) == [
        "default", "group:zzz", "reports", "group:aaa", "group:mmm"]
    assert in_turn(["default", "group:aaa"], GROUPS, 7) == ["default", "group:aaa"]
    assert in_turn(["b", "a"], set(), 3) == ["b", "a"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
@pytest.mark.parametrize("queues", [(), ("--groups", "aaa,zzz")],
                         ids=["every-queue", "groups-only"])
def test_a_slow_group_s_backlog_does_not_hold_back_another_group(start_worker,
                                                                  queues) -> None:
    slow_total = 80
    worker = start_worker(*queues, "--concurrency", "2", "--batch", "4",
                          env={"MYSQLQ_TEST_EXTRA_TASK_MODULES":
                               "tests.testapp.fair_handlers"})
    wait_for(lambda: "started: queues=" in worker.output(), timeout=60,
             message="the worker to start")
    # Both groups get every message; only aaa's handler is slow (0.4 s each: 16 s of
    # backlog on two threads, 32 s on one).
    fair_handlers.fair.publish_many([{"seq": seq} for seq in range(slow_total)])
    wait_for(lambda: GateRun.objects.filter(label="fair/zzz").count() == slow_total,
             timeout=90, message="the fast group to handle every message")
    last_fast = GateRun.objects.filter(label="fair/zzz").order_by("-at")[0].at
    slow_by_then = GateRun.objects.filter(label="fair/aaa", at__lte=last_fast).count()
    # In name order alone, aaa's deliveries were claimed first at every round: zzz got
    # a thread only once aaa's 80 were done. In turn by claims alone, aaa's slow runs
    # filled the threads and zzz went at aaa's pace (nearly all of aaa's by zzz's last).
    # Served in turn, zzz is done after 6-13 of aaa's (quiet machine or three busy
    # loops beside it): the bound leaves zzz 100-200 ms a message.
    assert slow_by_then < slow_total // 2, (slow_by_then, worker.output()[-2000:])
    wait_for(lambda: GateRun.objects.filter(label="fair/aaa").count() == slow_total,
             timeout=90, message="the slow group to finish too")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
