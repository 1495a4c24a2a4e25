"""A stranger's lock on a consumer group's row (``mysqlq_topic_group``), with real workers.

A pump takes its group's row ``SKIP LOCKED``; a row held by a transaction left open
stopped the group silently (the pump answered as if there were nothing to do): its lag
grew, nothing was logged, and a ``--burst`` member waited without a word until the lock
ended. Now each member logs a lasting hold once, and again when the row is free, as it
does for a topic's row.

Timeouts below are liveness bounds, never performance assertions.
"""

from __future__ import annotations

import signal

import pytest

from django_mysqlq import broker
from django_mysqlq.models import Message
from django_mysqlq.topics import subscriptions
from django_mysqlq.worker.topics import group_spec
from tests.burst import assert_succeeded, enqueue_good
from tests.conftest import wait_for
from tests.testapp import topic_handlers
from tests.testapp.models import GateRun
from tests.topic_ops_support import Stranger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

ENV = {"MYSQLQ_TEST_EXTRA_TASK_MODULES":
       "tests.testapp.topic_handlers,tests.testapp.topic_ops_handlers"}
WORKER = ("--concurrency", "2")
HELD = "Group 'billing' of topic 'ledger': another session has held its row in mysqlq_topic_group"
FREE = "Group 'billing' of topic 'ledger': its row in mysqlq_topic_group is free again"


def started(worker) -> None:
    wait_for(lambda: "started: queues=" in worker.output(), timeout=60,
             message="the worker to start")


def handled(label: str, group: str) -> set[int]:
    return set(GateRun.objects.filter(label=label, key__startswith=f"{group}:", edge="end",
                                      outcome="ok").values_list("seq", flat=True))


def holding_group_row(topic: str, group: str) -> Stranger:
    return Stranger("SELECT id FROM mysqlq_topic_group WHERE topic = %s AND group_name = %s "
                    "FOR UPDATE", [topic, group])


def test_a_stranger_holding_a_groups_row_is_logged_and_a_burst_member_says_so(start_worker):
    label = "group-row-held"
    worker = start_worker(*WORKER, "--groups", "billing", env=ENV)
    started(worker)
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (0, 1)])
    wait_for(lambda: handled(label, "billing") == {0, 1}, timeout=20,
             message="billing to handle the first messages")
    stranger = holding_group_row("ledger", "billing")
    try:
        topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (2, 3)])
        burst = start_worker(*WORKER, "--groups", "billing", "--burst", env=ENV)
        wait_for(lambda: HELD in worker.output(), timeout=20,
                 message="the member to log the held row")
        wait_for(lambda: HELD in burst.output(), timeout=30,
                 message="the --burst member to log the held row, not wait silently")
        assert burst.popen.poll() is None  # (it waits for the group's backlog, saying why)
        assert handled(label, "billing") == {0, 1}
    finally:
        stranger.release()
    wait_for(lambda: handled(label, "billing") == {0, 1, 2, 3}, timeout=20,
             message="the messages published meanwhile, once the lock is gone")
    assert burst.wait(timeout=30) == 0, burst.output()[-3000:]
    wait_for(lambda: FREE in worker.output(), timeout=15,
             message="the member to log that the row is free again")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    output = worker.output()
    assert output.count(HELD) == 1, output[-3000:]
    assert "Database error in the worker loop" not in output


def test_a_worker_starts_though_a_stranger_holds_the_topic_table(start_worker):
    """Every row of mysqlq_topic locked (with the gaps: a new topic's INSERT waits): the
    start's INSERT IGNORE waited 50 s at a time, over and over, and the worker served
    nothing meanwhile nor heard its stop. Now each row waits its bound (2 s), is logged
    with the held table and left for later: the worker starts, serves its task queue,
    stops at once on SIGTERM, and makes the rows once the lock is gone."""
    label = "topic-table-held"
    broker.ensure_topic("other")
    stranger = Stranger("SELECT name FROM mysqlq_topic FOR UPDATE", [])
    try:
        worker = start_worker(*WORKER, env=ENV)
        quitter = start_worker(*WORKER, env=ENV)
        started(worker)
        started(quitter)
        tasks = [enqueue_good(f"{label}-{i}") for i in range(3)]
        wait_for(lambda: "Topic 'ledger': its row could not be made: another session holds "
                 "a lock on mysqlq_topic (" in worker.output(), timeout=20,
                 message="the held table logged")
        assert broker.position("ledger", "billing") is None
        assert_tasks_done(tasks)
        quitter.signal(signal.SIGTERM)
        assert quitter.wait(timeout=10) == 0, quitter.output()[-3000:]
    finally:
        stranger.release()
    wait_for(lambda: "Group 'billing' of topic 'ledger': its row is made" in worker.output(),
             timeout=90, message="the group's row made once the lock is gone")
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (0, 1)])
    wait_for(lambda: handled(label, "billing") == {0, 1}, timeout=20,
             message="billing to handle messages published after")
    assert_succeeded(*tasks)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert "Database error in the worker loop" not in worker.output()


def test_a_new_group_waits_for_a_held_group_table_and_the_worker_starts(start_worker):
    label = "group-table-held"
    [billing] = [group_spec(s) for s in subscriptions.groups()
                 if s.topic == "ledger" and s.group == "billing"]
    broker.ensure_topic("ledger")
    broker.create_group(billing)
    stranger = Stranger("SELECT id FROM mysqlq_topic_group FOR UPDATE", [])
    try:
        worker = start_worker(*WORKER, "--groups", "billing,audit", env=ENV)
        started(worker)
        wait_for(lambda: "Group 'audit' of topic 'ledger': its row could not be made: "
                 "another session holds a lock on mysqlq_topic_group" in worker.output(),
                 timeout=20, message="the held table logged")
    finally:
        stranger.release()
    wait_for(lambda: "Group 'audit' of topic 'ledger': its row is made" in worker.output(),
             timeout=90, message="the group's row made once the lock is gone")
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (0, 1)])
    wait_for(lambda: handled(label, "audit") == {0, 1} and handled(label, "billing") == {0, 1},
             timeout=20, message="both groups to handle messages published after")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert "Database error in the worker loop" not in worker.output()


def assert_tasks_done(ids: list[int]) -> None:
    wait_for(lambda: not Message.objects.filter(pk__in=ids).exists(), timeout=20,
             message="the task queue to be served meanwhile")
