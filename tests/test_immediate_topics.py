"""The test mode for topics: with MYSQLQ['IMMEDIATE'] a publish writes no table and, once
its transaction commits, this process's group and broadcast handlers of the topic run.

Before, publish had no test-mode branch: on SQLite (what docs/testing.md recommends) it
failed on MySQL-only SQL, and on MySQL it wrote a row that nothing in the test ran. Run
against the suite's MariaDB, asserting no queue table is touched; the same on SQLite is in
tests/nonmysql/shop/suite.py.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_mysqlq import (
    ArgumentEncodingError,
    PayloadTooLarge,
    Topic,
    TopicEvent,
    immediate_topics,
)
from django_mysqlq.exceptions import InvalidTaskOptions
from django_mysqlq.models import TopicMessage
from django_mysqlq.registry import registry
from django_mysqlq.signals import task_finished, task_started, topic_published
from django_mysqlq.topics import subscriptions

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def on(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE": True}
    immediate_topics.reset()


@pytest.fixture
def seen() -> Iterator[list[tuple[Any, ...]]]:
    """Subscribes two groups and a broadcast handler to topic ``shop``; records their
    calls and the signals; forgets them after the test."""
    calls: list[tuple[Any, ...]] = []
    shop = Topic("shop")
    before = (set(subscriptions.groups()), set(subscriptions.broadcast()))

    @shop.subscribe(group="billing")
    def bill(event: TopicEvent) -> None:
        calls.append(("billing", event))
        if event.payload == "bad":
            raise ValueError("billing refused it")

    @shop.subscribe(group="mailing")
    async def mail(event: TopicEvent) -> None:
        calls.append(("mailing", event))

    @shop.subscribe(broadcast=True)
    def forget(event: TopicEvent) -> None:
        calls.append(("broadcast", event))

    def published(sender: str, count: int, **kwargs: Any) -> None:
        calls.append(("published", sender, count))

    def started(sender: Any, message_id: int, attempt: int, **kwargs: Any) -> None:
        calls.append(("started", sender.name, attempt))

    def finished(sender: Any, outcome: str, **kwargs: Any) -> None:
        calls.append(("finished", sender.name, outcome))

    pairs = [(topic_published, published), (task_started, started),
             (task_finished, finished)]
    for signal, receiver in pairs:
        signal.connect(receiver)
    yield calls
    for signal, receiver in pairs:
        signal.disconnect(receiver)
    for subscription in {*subscriptions.groups(), *subscriptions.broadcast()} - {
            *before[0], *before[1]}:
        subscriptions.remove(subscription)
        if subscription.task is not None:
            registry._tasks.pop(subscription.task.name, None)


def handled(calls: list[tuple[Any, ...]]) -> list[tuple[str, int, Any, str | None]]:
    return [(who, event.offset, event.payload, event.group) for who, event in
            (call for call in calls if isinstance(call[-1], TopicEvent))]


def test_autocommit_runs_every_group_and_broadcast_handler_at_once_writing_nothing(
        on, seen):
    before = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        Topic("shop").publish({"id": 1, "items": (1, 2)}, key=42)
    assert not [q for q in queries.captured_queries if "mysqlq_" in q["sql"]]
    assert not TopicMessage.objects.exists()
    assert seen[0] == ("published", "shop", 1)
    assert handled(seen) == [
        ("billing", 1, {"id": 1, "items": [1, 2]}, "billing"),  # the JSON round trip
        ("mailing", 1, {"id": 1, "items": [1, 2]}, "mailing"),
        ("broadcast", 1, {"id": 1, "items": [1, 2]}, None)]
    # A group's delivery runs as a worker runs it: its task's signals around the call.
    assert ("started", "topic:shop:billing", 1) in seen
    assert ("finished", "topic:shop:mailing", "succeeded") in seen
    event = seen[2][1]
    assert (event.topic, event.key) == ("shop", "42")
    assert before <= event.published_at <= timezone.now()
    assert event.published_at.tzinfo is not None
    assert event.published_at.utcoffset() == dt.timedelta(0)

    seen.clear()
    Topic("shop").publish_many(["a", "b"], keys=["k", None])
    assert seen[0] == ("published", "shop", 2)
    assert [(who, offset, value) for who, offset, value, _ in handled(seen)] == [
        ("billing", 2, "a"), ("mailing", 2, "a"), ("broadcast", 2, "a"),
        ("billing", 3, "b"), ("mailing", 3, "b"), ("broadcast", 3, "b")]
    assert [call[-1].key for call in seen if isinstance(call[-1], TopicEvent)][::3] == [
        "k", None]
    assert not TopicMessage.objects.exists()


def test_in_a_transaction_they_run_at_the_commit_and_never_after_a_rollback(on, seen):
    with transaction.atomic():
        Topic("shop").publish("kept")
        assert seen == []
    assert [value for _, _, value, _ in handled(seen)] == ["kept"] * 3
    seen.clear()
    with transaction.atomic():
        Topic("shop").publish("dropped")
        transaction.set_rollback(True)
    Topic("shop").publish("next")
    # Offsets are given at the commit: the rolled back message took none.
    assert {(offset, value) for _, offset, value, _ in handled(seen)} == {(2, "next")}
    assert ("published", "shop", 1) in seen and len(handled(seen)) == 3


def test_what_publish_refuses_runs_nothing(on, seen, settings):
    shop = Topic("shop")
    with pytest.raises(ArgumentEncodingError, match="can't be encoded as JSON"):
        shop.publish({"when": object()})
    with pytest.raises(ArgumentEncodingError, match="isn't a string"):
        shop.publish_many([{"ok": 1}, {1: "int key"}])
    with pytest.raises(InvalidTaskOptions, match="must be a non-empty string"):
        shop.publish(1, key="")
    with pytest.raises(InvalidTaskOptions, match="2 payloads but 1 keys"):
        shop.publish_many([1, 2], keys=["a"])
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 100}
    with pytest.raises(PayloadTooLarge, match="MAX_PAYLOAD_BYTES"):
        shop.publish("x" * 200)
    assert seen == []
    assert shop.publish_many([]) == 0 and seen == []


def test_a_failing_handler_is_raised_in_the_publisher_after_every_handler_ran(on, seen):
    with pytest.raises(ValueError, match="billing refused it"):
        Topic("shop").publish_many(["bad", "fine"])
    # Not retried (one call each), and the others still got every message.
    assert handled(seen) == [
        ("billing", 1, "bad", "billing"), ("mailing", 1, "bad", "mailing"),
        ("broadcast", 1, "bad", None), ("billing", 2, "fine", "billing"),
        ("mailing", 2, "fine", "mailing"), ("broadcast", 2, "fine", None)]
    assert ("finished", "topic:shop:billing", "failed") in seen


def test_with_immediate_raise_off_a_failing_handler_is_logged(settings, seen, caplog):
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE": True, "IMMEDIATE_RAISE": False}
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        Topic("shop").publish("bad")
    assert len(handled(seen)) == 3
    assert "failed (immediate mode, not retried)" in caplog.text
    assert "billing refused it" in caplog.text


def test_a_failing_broadcast_handler_is_raised_or_logged(on, seen, settings, caplog):
    @Topic("shop").subscribe(broadcast=True)
    def breaks(event: TopicEvent) -> None:
        raise RuntimeError("broadcast broke")

    with pytest.raises(RuntimeError, match="broadcast broke"):
        Topic("shop").publish("fine")
    assert len(handled(seen)) == 3
    settings.MYSQLQ = {**settings.MYSQLQ, "IMMEDIATE": True, "IMMEDIATE_RAISE": False}
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        Topic("shop").publish("fine")
    assert "Broadcast handler" in caplog.text and "broadcast broke" in caplog.text
