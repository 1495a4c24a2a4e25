"""Retiring a consumer group, against the real MariaDB: a group subscribed again under the
name of an older one starts at its own ``start`` (not after the older one's last
delivery), and ``manage.py queuetopic drop`` retires a group (no worker process: the pump
and acks are called the way a worker calls them)."""

from __future__ import annotations

import logging

import pytest

from django_mysqlq import broker
from django_mysqlq.models import TopicDelivery, TopicGroup
from tests.topic_ops_support import forget_before, group, handle, publish, spec

pytestmark = pytest.mark.django_db(transaction=True)


def abandoned_by_hand(topic: str, name: str) -> None:
    """An old group ``name`` that had offsets 1-6 delivered and handled, then abandoned as
    the docs used to say (its row deleted by hand); retention deleted offsets 1-2 and
    their links since. Offsets 7-10 were published after it was abandoned."""
    old = group(topic, name)
    publish(topic, 6)
    assert broker.pump(old, batch=10, window=100) == 6
    handle(old, 6)
    TopicGroup.objects.filter(topic=topic, group_name=name).delete()
    publish(topic, 4, start=6)
    forget_before(topic, 3)
    TopicDelivery.objects.filter(topic=topic, offset__lt=3).delete()


@pytest.mark.parametrize(("start", "position"), [("latest", 10), ("earliest", 2)])
def test_a_group_subscribed_again_after_a_hand_delete_starts_at_its_start(
        start: str, position: int) -> None:
    """Before, its creation went on after the old group's last delivery (offset 6): with
    ``latest`` it handled the kept messages 7-10 published before it was subscribed, with
    ``earliest`` it skipped the kept messages 3-6."""
    abandoned_by_hand("events", "billing")
    again = spec("events", "billing", start=start)
    assert broker.create_group(again) is True
    assert broker.position("events", "billing") == position


def test_a_row_deleted_while_its_members_run_is_still_made_again_after_its_last_delivery(
        caplog) -> None:
    """The one case that goes on after the group's last delivery: a running member's pump
    finds no row (``_missing``)."""
    abandoned_by_hand("events", "billing")
    member = spec("events", "billing", start="latest")
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        assert broker.pump_group(member, batch=10, window=10, recreate=True).made == 0
    assert broker.position("events", "billing") == 6
    assert "made it again at position 6" in caplog.text
