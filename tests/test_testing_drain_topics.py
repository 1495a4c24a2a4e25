"""django_mysqlq.testing.drain() delivers topic messages to this process's consumer groups:
it gives the groups their rows, pumps them as a worker does (offsets, deliveries in
``group:<group>``) and runs the deliveries with the real retries and dead letters.

Before, drain() ran queued tasks only: a published message reached no group handler.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_mysqlq import Topic, TopicEvent, broker
from django_mysqlq.models import Message, TopicGroup, TopicState
from django_mysqlq.registry import registry
from django_mysqlq.testing import DrainResult, drain
from django_mysqlq.topics import subscriptions
from tests.testapp import testing_tasks as tt
from tests.testapp.models import Ledger

TOPIC = "drained"


@pytest.fixture
def calls() -> Iterator[list[tuple[str, int, Any, str | None]]]:
    """Subscribes the groups ``billing`` and ``mailing`` (and ``earlybird``, start
    earliest) to topic ``drained``; records each call as (group, offset, payload, key);
    forgets them after the test. A payload ``{"fail": n}`` fails its first n attempts in
    ``billing``; ``{"fail": "always"}`` every one."""
    seen: list[tuple[str, int, Any, str | None]] = []
    topic = Topic(TOPIC)
    before = (set(subscriptions.groups()), set(subscriptions.broadcast()))

    def record(group: str, event: TopicEvent) -> None:
        seen.append((group, event.offset, event.payload, event.key))
        if group != "mailing":  # (an async handler: no ORM)
            Ledger.objects.create(label=f"{group}:{event.offset}", pid=0)

    @topic.subscribe(group="billing", retry_backoff=[0.2], max_attempts=3)
    def bill(event: TopicEvent) -> None:
        record("billing", event)
        fail = event.payload.get("fail", 0) if isinstance(event.payload, dict) else 0
        tries = sum(1 for call in seen if call[:2] == ("billing", event.offset))
        if fail == "always" or tries <= fail:
            raise ValueError(f"billing refused #{event.offset}")

    @topic.subscribe(group="mailing")
    async def mail(event: TopicEvent) -> None:
        record("mailing", event)

    @topic.subscribe(group="earlybird", start="earliest")
    def early(event: TopicEvent) -> None:
        record("earlybird", event)

    yield seen
    for subscription in {*subscriptions.groups(), *subscriptions.broadcast()} - {
            *before[0], *before[1]}:
        subscriptions.remove(subscription)
        if subscription.task is not None:
            registry._tasks.pop(subscription.task.name, None)


def runs(calls: list[tuple[str, int, Any, str | None]], group: str) -> list[int]:
    return [offset for who, offset, _, _ in calls if who == group]


def outcomes(result: DrainResult) -> list[tuple[str, int, str]]:
    return [(item.task_name, item.attempt, item.outcome) for item in result.outcomes]


@pytest.mark.django_db(transaction=True)
def test_a_group_handler_runs_once_per_message(calls) -> None:
    Topic(TOPIC).publish_many([{"n": 1}, {"n": 2}, {"n": 3}])
    result = drain(["group:billing"])
    assert runs(calls, "billing") == [1, 2, 3]
    assert [payload for who, _, payload, _ in calls] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert outcomes(result) == [(f"topic:{TOPIC}:billing", 1, "succeeded")] * 3
    assert not Message.objects.filter(queue="group:billing").exists()  # acked
    assert TopicGroup.objects.get(topic=TOPIC, group_name="billing").position == 3
    assert drain(["group:billing"]).processed == 0  # each message once
    Topic(TOPIC).publish({"n": 4})
    assert drain(["group:billing"]).processed == 1
    assert runs(calls, "billing") == [1, 2, 3, 4]


@pytest.mark.django_db(transaction=True)
def test_two_groups_on_one_topic_each_get_every_message(calls) -> None:
    Topic(TOPIC).publish_many([{"n": 1}, {"n": 2}], keys=["a", None])
    tt.echo.enqueue("task")  # ordinary tasks are drained in the same run
    result = drain()
    assert sorted(runs(calls, "billing")) == sorted(runs(calls, "mailing")) == [1, 2]
    assert runs(calls, "earlybird") == [1, 2]
    assert result.succeeded == 7 and Ledger.objects.filter(label="task").exists()
    assert [call[3] for call in calls if call[0] == "mailing"] == ["a", None]


@pytest.mark.django_db(transaction=True)
def test_messages_of_one_key_run_in_order_within_a_group(calls) -> None:
    # a1 fails once: a2 waits behind it (blocked) while b's messages go past.
    Topic(TOPIC).publish_many([{"fail": 1}, {"n": 2}, {"n": 3}, {"n": 4}],
                              keys=["a", "b", "a", "b"])
    result = drain(["group:billing"], wait_seconds=10, raise_errors=False)
    assert runs(calls, "billing") == [1, 2, 4, 1, 3]
    assert (result.succeeded, result.retried) == (4, 1)


@pytest.mark.django_db(transaction=True)
def test_a_failing_handler_is_retried_then_dead_and_raised(calls) -> None:
    Topic(TOPIC).publish({"fail": "always"}, key="k")
    with pytest.raises(ValueError, match="billing refused #1") as caught:
        drain(["group:billing"])  # its retry is 0.2 s away: not waited for
    assert caught.value.__notes__[0].startswith("django_mysqlq.testing.drain(): 1 attempt(s)")
    delivery = Message.objects.get(queue="group:billing")
    assert (delivery.status, delivery.attempts) == ("scheduled", 1)
    result = drain(["group:billing"], wait_seconds=10, raise_errors=False)
    assert outcomes(result) == [(f"topic:{TOPIC}:billing", 2, "retried"),
                                (f"topic:{TOPIC}:billing", 3, "failed")]
    assert [str(error) for error in result.errors] == ["billing refused #1"] * 2
    assert runs(calls, "billing") == [1, 1, 1]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("dead", 3)  # the group's dead letter


@pytest.mark.django_db(transaction=True)
def test_queues_names_the_groups_delivered_to(calls) -> None:
    Topic(TOPIC).publish({"n": 1})
    assert drain(["default"]).processed == 0
    # A drain of other queues leaves the topic alone: no offset, no row of it.
    assert not TopicState.objects.filter(name=TOPIC).exists()
    assert not TopicGroup.objects.exists()
    drain(["group:mailing"])
    assert [call[0] for call in calls] == ["mailing"]
    # The topic's other groups got their rows with mailing's, before the message had
    # its offset: a later drain of theirs still gets it.
    drain(["group:billing"])
    assert [call[0] for call in calls] == ["mailing", "billing"]


@pytest.mark.django_db(transaction=True)
def test_a_latest_group_gets_what_had_no_offset_when_it_was_made(calls) -> None:
    topic = Topic(TOPIC)
    topic.publish({"n": 1})
    broker.sequence(TOPIC)  # given its offset before any group existed (as by a worker)
    topic.publish({"n": 2})
    drain()
    # start="latest": after the last offset given out when drain() made the group.
    assert runs(calls, "billing") == runs(calls, "mailing") == [2]
    assert runs(calls, "earlybird") == [1, 2]


@pytest.mark.django_db  # a plain TestCase: the publishes are uncommitted
def test_inside_a_testcase_the_uncommitted_publishes_are_delivered(calls) -> None:
    Topic(TOPIC).publish_many([{"n": 1}, {"fail": "always"}])
    result = drain(wait_seconds=10, raise_errors=False)
    assert runs(calls, "mailing") == [1, 2]
    assert runs(calls, "billing") == [1, 2, 2, 2]
    assert (result.dead, len(result.errors)) == (1, 3)
    assert Ledger.objects.filter(label="billing:2").count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_drain_of_other_queues_imports_no_task_module(settings) -> None:
    """drain(["default"]) leaves topics alone, yet imported every task module (to find the
    groups' subscriptions) whenever the topics' database was drained: a task module that
    fails to import made it raise ImproperlyConfigured. It imports them only when it may
    deliver to a group: no queues given, or a ``group:`` queue named."""
    from django.core.exceptions import ImproperlyConfigured

    settings.MYSQLQ = {**settings.MYSQLQ, "TASK_MODULES": [
        *settings.MYSQLQ.get("TASK_MODULES", []), "tests.testapp.broken_tasks"]}
    tt.echo.enqueue("task")
    assert drain(["default"]).succeeded == 1
    assert Ledger.objects.filter(label="task").exists()
    for queues in (None, ["group:billing"], ["default", "group:billing"]):
        with pytest.raises(ImproperlyConfigured, match=(
                r"^Could not import the task module 'tests.testapp.broken_tasks' "
                r"\(MYSQLQ\['TASK_MODULES'\] lists it\): ModuleNotFoundError")):
            drain(queues)
