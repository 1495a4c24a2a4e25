"""kill -9 at each step of a topic message's way to its groups, with the transaction open.

A worker process stops dead right after one statement of a step (tests/stall_at.py):
while it sequences (offsets stamped, the topic row locked), while it pumps (deliveries
and their links inserted, the group's position moved, the group row locked) and while it
acks (deliveries deleted). It is killed there with kill -9; a new member must then get
every message to every group: none lost, none twice except runs of the killed process,
key order kept, nothing left in the queue, every position at the topic's last offset.
Each step at the tests' default isolation level (READ COMMITTED), and the sequencing and
pumping steps again with both processes at REPEATABLE READ.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from django_mysqlq import broker
from django_mysqlq.models import Message, TopicDelivery
from tests.conftest import wait_for
from tests.kill_support import PATIENCE, WORKER, kill_when_stalled, stalling_worker
from tests.subject_support import order_violations
from tests.test_topics_workers import ENV, GROUPS, ok_seqs, publish, started, stop
from tests.testapp.models import GateRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TOTAL = 60
#: The statement after which the worker stops, by step.
STEPS = {
    "sequence": r"^UPDATE mysqlq_topic SET last_offset",
    "pump": r"^UPDATE mysqlq_topic_group SET position",
    "link": r"^INSERT INTO mysqlq_topic_delivery",
    "ack": r"^\s*DELETE m FROM .* mysqlq_message",
}
REPEATABLE_READ = {"MYSQLQ_TEST_ISOLATION": "repeatable read"}


@pytest.mark.parametrize(("step", "isolation"), [
    ("sequence", {}), ("pump", {}), ("link", {}), ("ack", {}),
    ("sequence", REPEATABLE_READ), ("pump", REPEATABLE_READ),
], ids=["sequence", "pump", "link", "ack", "sequence-rr", "pump-rr"])
def test_a_member_killed_inside_a_step_loses_nothing(start_worker, tmp_path: Path,
                                                     step: str, isolation: dict[str, str]
                                                     ) -> None:
    label = f"kill-at-{step}"
    marker = tmp_path / "stalled"
    doomed = stalling_worker(start_worker, STEPS[step], marker, env={**ENV, **isolation})
    started(doomed)
    publish(label, TOTAL)
    kill_when_stalled(doomed, marker, step)
    survivor = start_worker(*WORKER, env={**ENV, **isolation})
    started(survivor)

    def all_handled() -> bool:
        return all(set(ok_seqs(label, group)) == set(range(TOTAL)) for group in GROUPS)

    try:
        wait_for(all_handled, timeout=PATIENCE, message="every group to handle every message")
        wait_for(lambda: not Message.objects.filter(queue__startswith="group:").exists(),
                 timeout=PATIENCE, message="the queue to empty")
    except BaseException:
        print(marker.read_text(), survivor.output()[-3000:])
        for group in GROUPS:
            print(group, "missing", sorted(set(range(TOTAL)) - set(ok_seqs(label, group))))
        raise
    stop(survivor)
    for group in GROUPS:
        for seq, count in ok_seqs(label, group).items():
            if count > 1:
                pids = set(GateRun.objects.filter(
                    label=label, key__startswith=f"{group}:", seq=seq, edge="end",
                    outcome="ok").values_list("pid", flat=True))
                assert doomed.pid in pids, f"{group} handled #{seq} twice, no run killed"
        assert broker.position("ledger", group) == broker.last_offset("ledger")
        offsets = TopicDelivery.objects.filter(topic="ledger", group_name=group
                                               ).values_list("offset", flat=True)
        assert len(offsets) == len(set(offsets)), f"{group}: an offset delivered twice"
    assert order_violations(label, killed=frozenset({doomed.pid})) == []
