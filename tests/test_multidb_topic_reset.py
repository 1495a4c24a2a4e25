"""A topic group reset given an alias, called from a thread bound to another one (two
servers: tests/multidb_support.py).

``broker.reset_group(..., alias=X)`` moved the position on X but cancelled the waiting
deliveries on the thread's bound alias (``routing.on_alias``): messages there with the
same ids were cancelled, and the group's own waiting deliveries still ran. The cancel
now runs in the reset's own transaction, on X."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_mysqlq import broker, routing
from django_mysqlq.broker import topic_reset
from django_mysqlq.models import Attempt, Message, TopicGroup
from tests import multidb_support as mdb
from tests.operator_support import OPERATOR
from tests.testapp import tasks
from tests.topic_ops_support import group, publish

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__")]

B = mdb.ALIAS_B
QUEUE_B = "mdb_b"


@pytest.fixture(autouse=True)
def queues_on_two_servers(second_server: None, settings: Any) -> Iterator[None]:
    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {QUEUE_B: {"DATABASE": B}}}
    for table in ("message", "attempt"):
        mdb.query(B, f"DELETE FROM mysqlq_{table}")  # B is not flushed between tests
    yield


def test_a_reset_given_an_alias_cancels_there_whatever_the_thread_is_bound_to() -> None:
    made = group("mdb_feed", "billing")
    publish("mdb_feed", 3)
    broker.pump(made, batch=100, window=100)
    ids = sorted(Message.objects.filter(queue=made.queue).values_list("id", flat=True))
    # Messages of a queue on B that happen to have the same ids (each database counts
    # its own ids).
    for n in range(len(ids)):
        tasks.record.using(queue=QUEUE_B).enqueue(f"on b {n}")
    mdb.query(B, "UPDATE mysqlq_message SET id = id + 1000000000")
    found = [int(row[0]) for row in mdb.query(B, "SELECT id FROM mysqlq_message ORDER BY id")]
    for was, now in zip(found, ids, strict=True):
        mdb.query(B, "UPDATE mysqlq_message SET id = %s WHERE id = %s", [now, was])
    with routing.on_alias(B):  # as a task of a queue on B runs
        done = broker.reset_group("mdb_feed", "billing", broker.ResetTarget(edge="earliest"),
                                  OPERATOR, alias="default")
    assert (done.old_position, done.new_position, done.cancelled) == (3, 0, 3)
    assert TopicGroup.objects.get(topic="mdb_feed", group_name="billing").position == 0
    # The group's own waiting deliveries are cancelled, on the reset's database ...
    assert not Message.objects.filter(queue=made.queue).exists()
    assert Attempt.objects.filter(task_name=made.task_name, outcome="cancelled",
                                  error_message=topic_reset.RESET_NOTE).count() == 3
    # ... and B's messages with the same ids are left alone.
    assert mdb.query(B, "SELECT id, status FROM mysqlq_message ORDER BY id") == [
        (message_id, "ready") for message_id in ids]
    assert mdb.query(B, "SELECT COUNT(*) FROM mysqlq_attempt") == [(0,)]
