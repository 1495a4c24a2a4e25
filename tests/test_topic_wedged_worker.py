"""One topic whose offsets can't be given must not stop a worker's other work.

A topic row changed by hand (its ``last_offset`` at BIGINT's largest value) makes every
sequencing round of that topic fail on the server (1264, out of range). Its groups can't
get new messages until it is put back; the worker's other groups, its broadcast reader
and its plain tasks must go on, and the failure must be said once, not at every pump.
"""

from __future__ import annotations

import time

import pytest

from django_mysqlq import Topic, broker
from django_mysqlq.models import TopicGroup, TopicState
from tests.burst import run_burst
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import GateRun, Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

ENV = {"MYSQLQ_TEST_EXTRA_TASK_MODULES":
       "tests.testapp.topic_ops_handlers,tests.testapp.topic_handlers",
       "MYSQLQ_TEST_LEASE": "4"}
WEDGED = 2**63 - 1


def _other_work_flows() -> None:
    """The other topic's group and the plain tasks each handle five messages."""
    for seq in range(5):
        Topic("ledger").publish({"label": "flowing", "seq": seq}, key="k")
        tasks.record.enqueue("plain", seq)
    wait_for(lambda: GateRun.objects.filter(label="flowing", key="billing:k",
                                            edge="end").count() == 5,
             timeout=30, message="the other topic's group to handle its messages")
    wait_for(lambda: Ledger.objects.filter(label="plain").count() == 5, timeout=30,
             message="plain tasks to run")


def test_a_wedged_topic_holds_up_only_its_own_groups(start_worker) -> None:
    worker = start_worker("--concurrency", "4", "--groups", "ops,billing",
                          "--queues", "default", env=ENV)
    wait_for(lambda: TopicGroup.objects.filter(group_name__in=["ops", "billing"]).count() == 2,
             timeout=60, message="the groups' rows (they start at the latest offset)")
    Topic("opsfeed").publish({"label": "wedged", "seq": 0})
    wait_for(lambda: GateRun.objects.filter(label="wedged", key="ops:").exists(),
             timeout=30, message="the ops group to handle the first message")
    TopicState.objects.filter(name="opsfeed").update(last_offset=WEDGED)
    Topic("opsfeed").publish({"label": "wedged", "seq": 1})
    _other_work_flows()
    said = "could not give offsets to messages of topic 'opsfeed'"
    wait_for(lambda: said in worker.output(), timeout=30,
             message="the recovery leader to say it can't sequence the topic")
    time.sleep(4.5)  # another round of the leader's (MYSQLQ_TEST_LEASE)
    output = worker.output()
    assert "Database error in the worker loop" not in output, output[-3000:]
    assert output.count(said) == 1, output[-3000:]
    # Put back: the waiting message gets its offset and the group goes on.
    TopicState.objects.filter(name="opsfeed").update(last_offset=1)
    Topic("opsfeed").publish({"label": "wedged", "seq": 2})
    wait_for(lambda: GateRun.objects.filter(label="wedged", key="ops:", edge="end")
             .count() == 3, timeout=30, message="the ops group to go on once put back")


def test_a_group_whose_pump_fails_holds_up_no_other_group_or_queue(start_worker) -> None:
    # The group has every message, and so stamps its topic's next ones in its own pump:
    # with the topic's last offset at BIGINT's largest value that pump fails (1264) at
    # every round. It used to end the worker's whole loop round, claims included.
    worker = start_worker("--concurrency", "4", "--groups", "ops,billing",
                          "--queues", "default", env=ENV)
    wait_for(lambda: TopicGroup.objects.filter(group_name__in=["ops", "billing"]).count() == 2,
             timeout=60, message="the groups' rows (they start at the latest offset)")
    TopicState.objects.filter(name="opsfeed").update(last_offset=WEDGED)
    TopicGroup.objects.filter(topic="opsfeed", group_name="ops").update(position=WEDGED)
    Topic("opsfeed").publish({"label": "wedged", "seq": 0})
    said = "Group 'ops' of topic 'opsfeed': its pump failed"
    wait_for(lambda: said in worker.output(), timeout=30,
             message="the worker to say the ops group's pump fails")
    _other_work_flows()
    output = worker.output()
    assert "Database error in the worker loop" not in output, output[-3000:]
    assert output.count(said) == 1, output[-3000:]
    assert not GateRun.objects.filter(label="wedged").exists()
    # The operator sees why the group's lag grows: on its row, in queuetopic groups.
    [state] = broker.groups("opsfeed", "ops")
    assert state.pump_problem.startswith("its pump failed: "), state.pump_problem
    assert "Out of range" in state.pump_problem, state.pump_problem
    assert state.lag == 1
    assert broker.groups("ledger", "billing")[0].pump_problem == ""
    # Put back: the waiting message gets its offset, the group goes on and says so.
    TopicState.objects.filter(name="opsfeed").update(last_offset=1)
    TopicGroup.objects.filter(topic="opsfeed", group_name="ops").update(position=1)
    Topic("opsfeed").publish({"label": "wedged", "seq": 1})
    wait_for(lambda: GateRun.objects.filter(label="wedged", key="ops:", edge="end")
             .count() == 2, timeout=30, message="the ops group to go on once put back")
    wait_for(lambda: "Group 'ops' of topic 'opsfeed' pumps again." in worker.output(),
             timeout=10, message="the worker to say the group pumps again")
    assert broker.groups("opsfeed", "ops")[0].pump_problem == ""


def test_a_position_set_past_the_end_is_set_back_and_a_fixed_row_s_note_cleared(
        start_worker) -> None:
    worker = start_worker("--concurrency", "2", "--groups", "ops", env=ENV)
    wait_for(lambda: TopicGroup.objects.filter(group_name="ops").exists(),
             timeout=60, message="the group's row")
    Topic("opsfeed").publish({"label": "fixed", "seq": 0})
    wait_for(lambda: GateRun.objects.filter(label="fixed", edge="end").exists(),
             timeout=30, message="the ops group to handle the first message")
    # The operator sets the position past the topic's end by hand: the next messages
    # published get the offsets between, and every one of them reaches the group.
    last = TopicState.objects.get(name="opsfeed").last_offset
    TopicGroup.objects.filter(topic="opsfeed", group_name="ops").update(position=last + 5)
    for seq in range(1, 8):
        Topic("opsfeed").publish({"label": "fixed", "seq": seq})
    wait_for(lambda: GateRun.objects.filter(label="fixed", edge="end").count() == 8,
             timeout=30, message="the group to handle every message published since")
    said = (f"Group 'ops' of topic 'opsfeed' was at position {last + 5}, past the topic's "
            f"last offset {last}")
    assert said in worker.output(), worker.output()[-3000:]
    assert broker.position("opsfeed", "ops") == last + 7
    # A row fixed by hand leaves nothing to pump, so no move of the position clears the
    # note of its problem; the member's next look does, without waiting for a publish.
    assert broker.note_pump_problem("opsfeed", "ops", "its pump failed: fixed by hand")
    wait_for(lambda: broker.groups("opsfeed", "ops")[0].pump_problem == "", timeout=15,
             message="the member's look to clear the note")
    [state] = broker.groups("opsfeed", "ops")
    assert state.pump_problem_at is None
    assert "the note of its problem is cleared" in worker.output(), worker.output()[-3000:]


def test_a_burst_member_ends_past_a_group_whose_pump_fails(start_worker) -> None:
    run_burst(start_worker, "--groups", "ops,billing", env=ENV)  # the groups' rows
    TopicState.objects.filter(name="opsfeed").update(last_offset=WEDGED)
    TopicGroup.objects.filter(topic="opsfeed", group_name="ops").update(position=WEDGED)
    Topic("opsfeed").publish({"label": "wedged", "seq": 0})
    Topic("ledger").publish({"label": "flowing", "seq": 0}, key="k")
    summary, output = run_burst(start_worker, "--groups", "ops,billing", env=ENV)
    assert summary["succeeded"] == 1, output[-3000:]
    assert output.count("Group 'ops' of topic 'opsfeed': its pump failed") == 1, output[-3000:]
    # (Its start's stamping failed too: said, and the worker started all the same.)
    assert "Topic 'opsfeed': its waiting messages could not be given offsets" in output
    assert GateRun.objects.filter(label="flowing", key="billing:k", edge="end").count() == 1
