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
