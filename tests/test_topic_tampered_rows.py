"""Topic rows changed by hand, in-process: the pump, the sequencer and the operators'
commands each hold up at most the group or topic concerned, and say what is wrong.
(With real workers: tests/test_topic_hostile_rows.py.)"""

from __future__ import annotations

import pytest

from django_mysqlq import Topic, broker
from django_mysqlq.broker import deliveries
from django_mysqlq.models import TopicDelivery, TopicMessage
from django_mysqlq.topicnames import delivery_task_name, group_queue

pytestmark = pytest.mark.django_db(transaction=True)


def spec(topic: str, group: str) -> broker.GroupSpec:
    return broker.GroupSpec(topic=topic, group=group, queue=group_queue(group),
                            task_name=delivery_task_name(topic, group), on_dead="skip",
                            max_attempts=3, retry_backoff=0.1, timeout=None, start="earliest")


def test_the_pump_stops_before_a_message_too_big_and_never_reads_one_past_the_room(
        monkeypatch) -> None:
    """A room of 3,000 bytes a row: a 2,900-byte payload is read but its delivery (with
    its wrapper and columns) does not fit; a 5,000-byte one is not even read."""
    room = 3000
    monkeypatch.setattr(deliveries, "row_room", lambda alias=None: room)
    billing = spec("sized", "billing")
    Topic("sized").publish_many(["a", "b", "x" * 2900, "c", "y" * 5000, "d"])
    broker.sequence("sized")
    broker.create_group(billing)
    pumped = broker.pump_group(billing, batch=100, window=100)
    assert (pumped.made, pumped.oversized) == (2, deliveries.Oversized(3, pumped.oversized
                                                                       .size, room))
    assert pumped.oversized is not None and pumped.oversized.size > room
    assert broker.position("sized", "billing") == 2
    again = broker.pump_group(billing, batch=100, window=100)
    assert (again.made, again.oversized) == (0, pumped.oversized)  # stays before it
    text = pumped.oversized.describe("sized", "billing")
    assert "Group 'billing' of topic 'sized' stops before offset 3" in text
    assert "queuetopic reset billing --topic sized --to-offset 4" in text
    broker.reset_group("sized", "billing", broker.ResetTarget(to_offset=4),
                       broker.Operator("cli:test"))
    past = broker.pump_group(billing, batch=100, window=100)
    assert past.made == 1 and past.oversized is not None
    assert (past.oversized.offset, past.oversized.size) == (5, 5002)  # its length, unread
    assert broker.position("sized", "billing") == 4
    assert sorted(TopicDelivery.objects.filter(topic="sized").values_list(
        "offset", flat=True)) == [1, 2, 4]
    assert TopicMessage.objects.filter(topic="sized").count() == 6
