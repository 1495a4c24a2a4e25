"""A delivery past its timeout whose mysqlq_topic_delivery link retention (or the archive)
deleted still names its topic, group and offset: from its task name and its payload's
``kwargs.offset``, as the dead-delivery alerts read them."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from django_mysqlq import broker
from django_mysqlq.models import TopicDelivery
from django_mysqlq.topicnames import delivery_of_task
from tests.topic_ops_support import claim, group, publish

pytestmark = pytest.mark.django_db(transaction=True)


def overran_without_links(count: int) -> list[int]:
    """``count`` claimed deliveries of ``orders``/``slow`` started 40 s ago (timeout
    30 s), their links deleted."""
    made = group("orders", "slow", timeout=30)
    publish("orders", count)
    broker.pump(made, batch=100, window=100)
    ids = [m.id for m in claim(made, count)]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_message SET started_at = UTC_TIMESTAMP(6) - INTERVAL "
                       f"40 SECOND WHERE id IN ({', '.join(['%s'] * len(ids))})", ids)
    TopicDelivery.objects.filter(message_id__in=ids).delete()
    return ids


def test_an_unlinked_overran_delivery_is_named_from_its_task_and_payload() -> None:
    first, second = overran_without_links(2)
    with connection.cursor() as cursor:  # a payload changed by hand into bad JSON
        cursor.execute("UPDATE mysqlq_message SET payload = '{\"kwargs\": ' WHERE id = %s",
                       [second])
    found = {o.message_id: (o.topic, o.group, o.offset) for o in broker.overran_deliveries()}
    assert found == {first: ("orders", "slow", 1), second: ("orders", "slow", None)}
    out = io.StringIO()
    call_command("queuestats", "--json", stdout=out)
    overran = {o["message_id"]: o for o in json.loads(out.getvalue())["overran"]}
    assert (overran[first]["topic"], overran[first]["group"], overran[first]["offset"]) == (
        "orders", "slow", 1)
    out = io.StringIO()
    call_command("queuestats", stdout=out)
    assert "of group 'slow' on topic 'orders' has run" in out.getvalue()
    assert " on offset 1 " in out.getvalue()


@pytest.mark.parametrize(("name", "parsed"), [
    ("topic:orders:billing", ("orders", "billing")),
    ("topic:orders:", None), ("topic::billing", None), ("topic:orders", None),
    ("orders:billing", None), ("topic:a:b:c", None),
])
def test_delivery_of_task(name: str, parsed: tuple[str, str] | None) -> None:
    assert delivery_of_task(name) == parsed
