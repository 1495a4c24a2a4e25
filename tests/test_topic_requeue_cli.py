"""A consumer group's dead letter requeued from the command line, as docs/streams.md
says: ``manage.py queuerequeue --task topic:<topic>:<group>`` (that topic's dead
deliveries of the group) or ``--queue group:<group>`` (every topic of the group), with
``--dry-run`` to count and ``--reset-attempts`` for a full set of attempts. The requeued
deliveries come back ready with the attempts said, and the group handles them (here
``testing.drain()``, which runs deliveries as a worker does)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from django_mysqlq import Topic, TopicEvent
from django_mysqlq.models import Attempt, Message
from django_mysqlq.registry import registry
from django_mysqlq.testing import drain
from django_mysqlq.topicnames import delivery_task_name
from django_mysqlq.topics import subscriptions

pytestmark = pytest.mark.django_db(transaction=True)

ORDERS, REFUNDS = "rq_orders", "rq_refunds"


class Plan:
    """What the handlers do: fail every run while ``failing``, and the first run of
    each offset in ``fail_once``; every run is recorded as (topic, group, offset)."""

    def __init__(self) -> None:
        self.failing = True
        self.fail_once: set[tuple[str, int]] = set()
        self.runs: list[tuple[str, str, int]] = []

    def run(self, group: str, event: TopicEvent) -> None:
        self.runs.append((event.topic, group, event.offset))
        if self.failing:
            raise RuntimeError(f"{group} refused {event.topic}@{event.offset}")
        if (event.topic, event.offset) in self.fail_once:
            self.fail_once.discard((event.topic, event.offset))
            raise RuntimeError(f"{group} refused {event.topic}@{event.offset} once more")


@pytest.fixture
def plan() -> Iterator[Plan]:
    """Group ``settle`` subscribed to two topics (one queue, ``group:settle``), group
    ``rqaudit`` to the first; two attempts each."""
    made = Plan()
    before = set(subscriptions.groups())

    @Topic(ORDERS).subscribe(group="settle", retry_backoff=[0.05], max_attempts=2)
    def settle_order(event: TopicEvent) -> None:
        made.run("settle", event)

    @Topic(REFUNDS).subscribe(group="settle", retry_backoff=[0.05], max_attempts=2)
    def settle_refund(event: TopicEvent) -> None:
        made.run("settle", event)

    @Topic(ORDERS).subscribe(group="rqaudit", retry_backoff=[0.05], max_attempts=2)
    def audit_order(event: TopicEvent) -> None:
        made.run("rqaudit", event)

    yield made
    for subscription in set(subscriptions.groups()) - before:
        subscriptions.remove(subscription)
        if subscription.task is not None:
            registry._tasks.pop(subscription.task.name, None)


def requeue(*args: str) -> str:
    out = io.StringIO()
    call_command("queuerequeue", *args, stdout=out)
    return out.getvalue().strip()


def deliveries(topic: str, group: str) -> list[tuple[str, int, int]]:
    """(status, attempts, max_attempts) of the group's deliveries of the topic, by id."""
    return list(Message.objects.filter(task_name=delivery_task_name(topic, group))
                .order_by("id").values_list("status", "attempts", "max_attempts"))


def outcomes(result: Any) -> list[tuple[str, int, str]]:
    return [(item.task_name, item.attempt, item.outcome) for item in result.outcomes]


def test_queuerequeue_brings_a_groups_dead_deliveries_back_to_be_handled(plan) -> None:
    Topic(ORDERS).publish_many([{"n": 1}, {"n": 2}])
    Topic(REFUNDS).publish({"n": 3})
    drain(["group:settle", "group:rqaudit"], wait_seconds=5, raise_errors=False)
    dead = [("dead", 2, 2)]
    assert deliveries(ORDERS, "settle") == deliveries(ORDERS, "rqaudit") == dead * 2
    assert deliveries(REFUNDS, "settle") == dead
    settle_orders = delivery_task_name(ORDERS, "settle")

    # --dry-run counts and changes nothing.
    assert requeue("--task", settle_orders, "--dry-run") == "2 message(s) would be requeued."
    assert requeue("--queue", "group:settle", "--dry-run") == "3 message(s) would be requeued."
    assert deliveries(ORDERS, "settle") == dead * 2 and deliveries(REFUNDS, "settle") == dead
    assert not Attempt.objects.filter(outcome="requeued").exists()

    # --task topic:<topic>:<group>: that topic's deliveries of the group, one more
    # attempt each; the group's other topic and the topic's other group stay dead.
    assert requeue("--task", settle_orders) == "Requeued 2 message(s)."
    assert deliveries(ORDERS, "settle") == [("ready", 2, 3)] * 2
    assert deliveries(REFUNDS, "settle") == dead
    assert deliveries(ORDERS, "rqaudit") == dead * 2
    history = Attempt.objects.filter(outcome="requeued")
    assert set(history.values_list("task_name", flat=True)) == {settle_orders}
    assert history.count() == 2
    assert {(actor[:4], note) for actor, note in history.values_list(
        "actor", "error_message")} == {("cli:", "requeued")}
    plan.failing = False
    plan.runs.clear()
    result = drain(["group:settle", "group:rqaudit"])
    assert outcomes(result) == [(settle_orders, 3, "succeeded")] * 2
    assert plan.runs == [(ORDERS, "settle", 1), (ORDERS, "settle", 2)]
    assert deliveries(ORDERS, "settle") == []  # handled (acked)

    # --queue group:<group> --reset-attempts: every topic of the group, a full set of
    # attempts: a first failure is retried, not dead again at once.
    assert requeue("--queue", "group:settle", "--dry-run") == "1 message(s) would be requeued."
    assert requeue("--queue", "group:settle", "--reset-attempts") == "Requeued 1 message(s)."
    assert deliveries(REFUNDS, "settle") == [("ready", 0, 2)]
    assert history.filter(task_name=delivery_task_name(REFUNDS, "settle")).get(
        ).error_message == "requeued with attempts reset"
    assert deliveries(ORDERS, "rqaudit") == dead * 2  # another group's queue
    plan.fail_once.add((REFUNDS, 1))
    plan.runs.clear()
    result = drain(["group:settle", "group:rqaudit"], wait_seconds=5, raise_errors=False)
    settle_refunds = delivery_task_name(REFUNDS, "settle")
    assert outcomes(result) == [(settle_refunds, 1, "retried"),
                                (settle_refunds, 2, "succeeded")]
    assert plan.runs == [(REFUNDS, "settle", 1)] * 2
    assert deliveries(REFUNDS, "settle") == []
    assert deliveries(ORDERS, "rqaudit") == dead * 2
