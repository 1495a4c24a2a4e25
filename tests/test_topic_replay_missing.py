"""A replay whose range lost messages (retention while it ran, or a hand delete) says
how many offsets got no delivery, and the first kept offset now."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.broker import topic_replay
from django_mysqlq.models import TopicDelivery, TopicGroup, TopicMessage
from tests.operator_support import OPERATOR
from tests.topic_ops_support import forget_before, group, publish

pytestmark = pytest.mark.django_db(transaction=True)


def replay(first: str, last: str) -> str:
    out = io.StringIO()
    call_command("queuetopic", "replay", "--topic", "orders", "--group", "billing",
                 "--from-offset", first, "--to-offset", last, stdout=out)
    return out.getvalue()


@pytest.fixture
def billing() -> broker.GroupSpec:
    made = group("orders", "billing")
    publish("orders", 10)
    broker.pump(made, batch=100, window=100)
    return made


def test_retention_while_a_replay_runs_is_said(billing, monkeypatch) -> None:
    """The range was checked against the kept offsets once; what retention deleted
    after that was skipped without a word ("Replayed offsets 1..6: 3 new deliveries")."""
    checked = topic_replay._check

    def check_then_retention(*args: Any) -> int:
        found = checked(*args)
        forget_before("orders", 4)  # retention's batch commits as the replay begins
        return found

    monkeypatch.setattr(topic_replay, "_check", check_then_retention)
    out = replay("1", "6")
    assert "Replayed offsets 1..6 of topic 'orders' into group 'billing': 3 new " in out
    assert ("WARNING: 3 of the 6 offsets had no message to replay (deleted while the "
            "replay ran, by retention, or before it by hand), so they got no delivery; the "
            "topic keeps offsets from 4 now.") in out, out
    assert TopicDelivery.objects.filter(group_name="billing", offset__lte=6).count() == 6 + 3


def test_a_range_with_messages_deleted_by_hand_is_said(billing) -> None:
    TopicMessage.objects.filter(topic="orders", offset__in=[3, 5]).delete()
    done = broker.replay_range(billing, 2, 7, OPERATOR)
    assert (done.replayed, done.missing, done.first_kept) == (4, 2, 1)
    assert "WARNING: 2 of the 6 offsets had no message" in replay("2", "7")
    whole = replay("8", "10")
    assert "3 new deliveries" in whole and "WARNING" not in whole


def test_the_admin_replay_says_it_too(billing, root) -> None:
    TopicMessage.objects.filter(topic="orders", offset=4).delete()
    row = TopicGroup.objects.get(group_name="billing")
    operate = reverse("admin:django_mysqlq_topicgroup_operate", args=[row.pk])
    page = root.post(operate, {"op": "replay", "first": "3", "last": "5"},
                     follow=True).content.decode()
    assert ("Replayed offsets 3..5 into group billing: 2 new deliveries. 1 of the 3 "
            "offsets had no message to replay") in page, page
    assert "the topic keeps offsets from 1 now." in page
