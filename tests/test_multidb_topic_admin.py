"""The topic admin with ``MYSQLQ['DATABASE']`` on another alias than Django's "default"
(``queues_b``, the second server of tests/test_multidb.py) and no ``DATABASE_ROUTERS``
entry: a consumer group's page and its Reset and Replay forms read and change the group
of that database, never a row of "default".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse

from django_mysqlq import broker, routing
from django_mysqlq.models import TopicGroup
from tests import multidb_support as mdb
from tests.topic_ops_support import group, handle, publish

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__")]

B = mdb.ALIAS_B
TOPIC_TABLES = ("topic_delivery", "topic_group", "topic_message", "topic", "message",
                "attempt", "queue")


def clear_b() -> None:
    for table in TOPIC_TABLES:
        mdb.query(B, f"DELETE FROM mysqlq_{table}")  # B is not flushed between tests


@pytest.fixture(autouse=True)
def queues_on_b(second_server: None, settings: Any) -> Iterator[None]:
    settings.MYSQLQ = {**settings.MYSQLQ, "DATABASE": B}
    assert not any("QueueRouter" in str(r) for r in django_settings.DATABASE_ROUTERS)
    clear_b()
    yield
    clear_b()


def orders_on_b() -> TopicGroup:
    """Topic "orders" on B, 4 messages; its group "billing" handled them (position 4)."""
    billing = group("orders", "billing")
    publish("orders", 4)
    broker.pump(billing, batch=10, window=10)
    handle(billing, 4)
    row = TopicGroup.objects.using(B).get(topic="orders", group_name="billing")
    assert row.position == 4
    assert not TopicGroup.objects.using("default").filter(pk=row.pk).exists()
    return row


def test_the_group_page_s_reset_and_replay_act_on_the_queue_database(root: Client) -> None:
    """The forms' view ran unbound: it read the group on "default" (404 "No such consumer
    group" here; a missing table or another group's row elsewhere)."""
    row = orders_on_b()
    page = root.get(reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]))
    assert page.status_code == 200 and b'id="reset-form"' in page.content
    operate = page.context["operate_url"]
    assert operate == reverse("admin:django_mysqlq_topicgroup_operate", args=[row.pk])
    response = root.post(operate, {"op": "reset", "to": "offset", "value": "2"}, follow=True)
    assert response.status_code == 200
    assert "position 4 -&gt; 1" in response.content.decode()
    row.refresh_from_db(using=B)
    assert row.position == 1 and row.changed_by == "admin:root"
    response = root.post(operate, {"op": "replay", "first": "1", "last": "1"}, follow=True)
    assert response.status_code == 200
    assert "Replayed offsets 1..1 into group billing: 1 new deliveries" in \
        response.content.decode(), [str(m) for m in response.context["messages"]]
    [(waiting,)] = mdb.query(B, "SELECT COUNT(*) FROM mysqlq_message WHERE queue=%s "
                             "AND status IN ('ready', 'scheduled')", [row.queue])
    assert waiting == 1
    assert routing.bound_alias() is None  # the view unbinds as it ends


def test_a_group_page_of_another_database_posts_its_forms_there(root: Client,
                                                                settings: Any) -> None:
    """A page on ``?database=default`` (a queue lives there) shows and resets the row of
    "default" with the same id, not B's: the forms and the page they come back to keep
    ``?database=``."""
    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {"plain": {"DATABASE": "default"}}}
    row = orders_on_b()
    with routing.on_alias("default"):
        group("audit", "shipping")
    mdb.query("default", "UPDATE mysqlq_topic_group SET id=%s WHERE group_name='shipping'",
              [row.pk])
    url = reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk])
    page = root.get(f"{url}?database=default")
    assert page.status_code == 200 and b"shipping" in page.content
    operate = page.context["operate_url"]
    assert operate.endswith("?database=default")
    response = root.post(operate, {"op": "reset", "to": "latest"})
    assert response.status_code == 302 and response["Location"] == f"{url}?database=default"
    twin = TopicGroup.objects.using("default").get(pk=row.pk)
    assert twin.group_name == "shipping" and twin.changed_by == "admin:root"
    row.refresh_from_db(using=B)
    assert row.position == 4 and row.changed_by == ""
