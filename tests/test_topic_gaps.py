"""A group behind its topic's last offset with no message left after its position.

Retention that doesn't wait for groups can delete every message a stopped group had not
had (``first_offset`` moves past the last offset); a stranger can delete messages or raise
``last_offset`` by hand. Such a group used to count as behind for good: it did not stamp
its topic's new messages (only a caught-up group does), so they waited for another reader
or the recovery leader's next upkeep, and a ``--burst`` member never ended.
"""

from __future__ import annotations

import datetime as dt

import pytest

from django_mysqlq import Topic, broker
from django_mysqlq.broker import Pumped
from django_mysqlq.models import TopicDelivery, TopicGroup, TopicMessage, TopicState
from tests.burst import run_burst
from tests.test_topics import spec
from tests.testapp.models import GateRun

pytestmark = pytest.mark.django_db(transaction=True)

FAR_FUTURE = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)


def behind_with_nothing_left(name: str) -> broker.GroupSpec:
    """A group at offset 1 of a topic with offsets 1-3 (it has had the first one)."""
    topic, group = Topic(name), spec(name, "slow")
    topic.publish("first")
    broker.sequence(name)
    broker.create_group(group)
    assert broker.position(name, "slow") == 1
    topic.publish_many(["second", "third"])
    broker.sequence(name)
    assert broker.last_offset(name) == 3
    return group


def delivered(name: str) -> list[int]:
    return sorted(TopicDelivery.objects.filter(topic=name).values_list("offset", flat=True))


def test_a_group_passed_by_retention_is_not_behind_and_stamps_new_messages() -> None:
    group = behind_with_nothing_left("swept")
    assert broker.prune_topic_batch("swept", FAR_FUTURE, 100, wait_for_groups=False) == 3
    assert TopicState.objects.get(name="swept").first_offset == 4
    assert not broker.group_behind(group)
    Topic("swept").publish("after the sweep")
    # Stamped and pumped in the group's own pump, not at the leader's next upkeep.
    assert broker.pump_group(group, batch=10, window=10, sequence=True).made == 1
    assert delivered("swept") == [4]
    assert broker.position("swept", "slow") == 4 and not broker.group_behind(group)


def test_a_group_behind_messages_deleted_by_hand_stamps_new_messages() -> None:
    group = behind_with_nothing_left("handswept")
    TopicMessage.objects.filter(topic="handswept", offset__gt=1).delete()
    assert not broker.group_behind(group)
    Topic("handswept").publish("after the delete")
    pumped = broker.pump_group(group, batch=10, window=10, sequence=True)
    assert pumped.made == 1, pumped
    assert delivered("handswept") == [4]
    assert broker.position("handswept", "slow") == 4


def test_a_raised_last_offset_holds_up_no_new_message() -> None:
    group = behind_with_nothing_left("raised")
    broker.pump_group(group, batch=10, window=10, sequence=True)
    assert broker.position("raised", "slow") == 3
    TopicState.objects.filter(name="raised").update(last_offset=100)
    assert not broker.group_behind(group)
    Topic("raised").publish("after the raise")
    assert broker.pump_group(group, batch=10, window=10, sequence=True).made == 1
    assert delivered("raised") == [2, 3, 101]
    assert broker.position("raised", "slow") == 101 and not broker.group_behind(group)


def test_a_group_behind_real_messages_still_pumps_them_before_any_new_one() -> None:
    group = behind_with_nothing_left("ordinary")
    Topic("ordinary").publish("fourth")
    assert broker.group_behind(group)
    assert broker.pump_group(group, batch=10, window=10, sequence=True) == Pumped(2, True)
    assert delivered("ordinary") == [2, 3]
    assert broker.pump_group(group, batch=10, window=10, sequence=True).made == 1
    assert delivered("ordinary") == [2, 3, 4]


@pytest.mark.worker
def test_a_burst_member_of_a_group_passed_by_retention_ends_and_has_the_new_message(
        start_worker) -> None:
    env = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.topic_ops_handlers"}
    run_burst(start_worker, "--groups", "ops", env=env)  # the group starts at the latest
    assert TopicGroup.objects.filter(topic="opsfeed", group_name="ops").exists()
    Topic("opsfeed").publish_many([{"label": "swept", "seq": n} for n in range(3)])
    broker.sequence("opsfeed")
    assert broker.prune_topic_batch("opsfeed", FAR_FUTURE, 100, wait_for_groups=False) == 3
    # Nothing left for it: the member ends (it used to wait for good).
    summary, output = run_burst(start_worker, "--groups", "ops", env=env)
    assert summary["succeeded"] == 0, output[-3000:]
    Topic("opsfeed").publish({"label": "kept", "seq": 3})
    summary, output = run_burst(start_worker, "--groups", "ops", env=env)
    assert summary["succeeded"] == 1, output[-3000:]
    assert list(GateRun.objects.filter(edge="end").values_list("label", "seq")) == [
        ("kept", 3)]
    assert broker.position("opsfeed", "ops") == 4
