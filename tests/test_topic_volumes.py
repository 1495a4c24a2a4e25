"""The topics the dashboard and ``queuestats`` rank by volume when there are more than
they show (``topic_overview.MAX_TOPICS``)."""

from __future__ import annotations

import pytest

from django_mysqlq import Topic, broker
from django_mysqlq.broker.topic_overview import MAX_TOPICS

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_busy_topic_is_ranked_whatever_its_name_among_more_topics_than_shown() -> None:
    """Taken in name order, the first 200 names were ranked: a busy topic named after
    them was missing from the ranking. Now the topics published to most recently are,
    whether their messages have offsets or not (nobody reads ``zz_busy``)."""
    busy = Topic("zz_busy")
    busy.publish_many([{"n": n} for n in range(5)])
    broker.sequence("zz_busy")  # (once, by the leader's round for unread topics)
    for index in range(MAX_TOPICS + 5):
        name = f"quiet{index:03d}"
        Topic(name).publish({"n": index})
        broker.sequence(name)
    busy.publish_many([{"n": n} for n in range(5, 10)])  # still publishing, not stamped
    volumes = broker.topic_volumes()
    assert len(volumes) == MAX_TOPICS
    assert (volumes[0].name, volumes[0].published[60]) == ("zz_busy", 10)
    assert all(volume.published[60] == 1 for volume in volumes[1:])
