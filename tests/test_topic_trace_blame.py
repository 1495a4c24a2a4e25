"""A lookup's trace: which operator action it blames for a group past an offset with no
delivery of it, and which deliveries it marks as replays."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from django_mysqlq import broker
from django_mysqlq.models import TopicDelivery, TopicGroup, TopicMessage
from tests.operator_support import OPERATOR
from tests.topic_ops_support import group, handle, publish

pytestmark = pytest.mark.django_db(transaction=True)

STARTED_AFTER = "  audit: never delivered: the group started after it (start latest)\n"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("queuetopic", *args, stdout=out)
    return out.getvalue()


def test_a_replay_or_a_reset_backwards_keeps_started_after_for_a_latest_group() -> None:
    """A replay (and a reset backwards) wrote the group's ``changed_at``, and the trace
    then said an operator moved the group past offsets it never had (they were
    published before it started) although nobody moved it forward."""
    publish("orders", 100)
    audit = group("orders", "audit", start="latest")  # at 100: offsets 1-100 came before
    assert run("lookup", "--topic", "orders", "--offset", "50").endswith(STARTED_AFTER)
    said = run("replay", "--topic", "orders", "--group", "audit", "--from-offset", "100",
               "--to-offset", "100")
    assert "1 new deliveries" in said
    after_replay = run("lookup", "--topic", "orders", "--offset", "50")
    assert after_replay.endswith(STARTED_AFTER), after_replay
    assert "moved past it" not in after_replay
    run("reset", "audit", "--topic", "orders", "--to-offset", "60")  # backwards: 100 -> 59
    assert TopicGroup.objects.get(group_name="audit").position == 59
    after_reset = run("lookup", "--topic", "orders", "--offset", "50")
    assert after_reset.endswith(STARTED_AFTER), after_reset
    [message] = json.loads(run("lookup", "--topic", "orders", "--offset", "50",
                                "--json"))["messages"]
    assert message["no_delivery"] == [
        {"group": "audit", "reason": STARTED_AFTER.split(": ", 1)[1].strip()}]
    broker.pump(audit, batch=100, window=100)  # 60-100 come again: 60 has a delivery
    assert "audit: #" in run("lookup", "--topic", "orders", "--offset", "60")


def test_only_a_reset_forward_is_blamed_for_a_skipped_offset() -> None:
    billing = group("orders", "billing")
    publish("orders", 10)
    broker.pump(billing, batch=3, window=100)  # 1-3 delivered
    handle(billing, 3)
    broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=8), OPERATOR)
    row = TopicGroup.objects.get(group_name="billing")
    assert (row.position, row.moved_forward_by) == (7, OPERATOR.name)
    skipped = run("lookup", "--topic", "orders", "--offset", "5")
    assert (f"  billing: no delivery record: its position was moved past it by "
            f"{OPERATOR.name}") in skipped
    # A replay later does not move the forward move's record, nor does it blame itself.
    run("replay", "--topic", "orders", "--group", "billing", "--from-offset", "1",
        "--to-offset", "2")
    assert TopicGroup.objects.get(group_name="billing").moved_forward_at == row.moved_forward_at
    assert f"moved past it by {OPERATOR.name}" in run("lookup", "--topic", "orders",
                                                      "--offset", "5")


def test_a_reset_backwards_is_not_blamed_for_a_missing_link() -> None:
    billing = group("orders", "billing")
    publish("orders", 10)
    broker.pump(billing, batch=100, window=100)
    handle(billing, 10)
    TopicDelivery.objects.filter(group_name="billing", offset=2).delete()  # by hand
    run("reset", "billing", "--topic", "orders", "--to-offset", "9")  # backwards: 10 -> 8
    row = TopicGroup.objects.get(group_name="billing")
    assert row.changed_at is not None and row.moved_forward_at is None
    out = run("lookup", "--topic", "orders", "--offset", "2")
    assert "  billing: no delivery record (its link row is missing)\n" in out, out


def test_a_resets_redelivery_is_not_marked_as_a_replay_only_a_replay_is(root) -> None:
    """Any later delivery of an offset to the same group was marked "(replay)" (JSON
    ``"replay": true``, the admin's trace too), a reset backwards' re-delivery included,
    though no replay ran."""
    billing = group("orders", "billing")
    publish("orders", 10)
    broker.pump(billing, batch=100, window=100)
    handle(billing, 10)
    run("reset", "billing", "--topic", "orders", "--to-offset", "8")  # 10 -> 7
    broker.pump(billing, batch=100, window=100)  # 8-10 again
    assert TopicDelivery.objects.filter(group_name="billing", offset=9).count() == 2
    text = run("lookup", "--topic", "orders", "--offset", "9")
    assert "(replay)" not in text and text.count("  billing: #") == 2, text
    [message] = json.loads(run("lookup", "--topic", "orders", "--offset", "9",
                                "--json"))["messages"]
    assert [d["replay"] for d in message["deliveries"]] == [False, False]
    row = TopicMessage.objects.get(topic="orders", offset=9)
    page = root.get(f"/admin/django_mysqlq/topicmessage/{row.pk}/change/").content.decode()
    assert 'id="topic-trace"' in page and "(replay)" not in page
    # A replay's delivery is marked, wherever it comes among them.
    run("replay", "--topic", "orders", "--group", "billing", "--from-offset", "9",
        "--to-offset", "9")
    [message] = json.loads(run("lookup", "--topic", "orders", "--offset", "9",
                                "--json"))["messages"]
    assert [d["replay"] for d in message["deliveries"]] == [False, False, True]
    assert run("lookup", "--topic", "orders", "--offset", "9").count("billing (replay): #") == 1
    page = root.get(f"/admin/django_mysqlq/topicmessage/{row.pk}/change/").content.decode()
    assert page.count("<strong>(replay)</strong>") == 1
