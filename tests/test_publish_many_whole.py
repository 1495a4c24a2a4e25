"""Many messages in one call: ``publish_many`` / ``enqueue_many`` outside a transaction write
all or none of them, however many statements they take; ``apublish`` / ``apublish_many``
from async code; a ``keys`` iterable longer than the values (endless) is refused."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection

from django_mysqlq.models import Message, TopicMessage
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

broker_topics = importlib.import_module("django_mysqlq.broker.topics")
broker_enqueue = importlib.import_module("django_mysqlq.broker.enqueue")


@contextlib.contextmanager
def refusing(table: str) -> Iterator[None]:
    """A trigger that makes the server refuse a row whose payload says "boom"."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TRIGGER mysqlq_test_refuse BEFORE INSERT ON {table} FOR EACH "
                       "ROW IF NEW.payload LIKE '%%boom%%' THEN SIGNAL SQLSTATE '45000' "
                       "SET MESSAGE_TEXT = 'refused by the test'; END IF")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS mysqlq_test_refuse")


def test_publish_many_whose_second_statement_fails_writes_none_of_them(monkeypatch) -> None:
    """Three messages, two a statement: the second INSERT is refused by the server. In
    autocommit the first two were committed (and delivered) while the call raised; now
    the statements run in one transaction and none is written."""
    from django_mysqlq import Topic

    monkeypatch.setattr(broker_topics, "PUBLISH_CHUNK", 2)
    with refusing("mysqlq_topic_message"), pytest.raises(DatabaseError, match="refused"):
        Topic("whole").publish_many(["a", "b", "boom"])
    assert not TopicMessage.objects.filter(topic="whole").exists()
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert Topic("whole").publish_many(["a", "b", "c"]) == 3
    assert TopicMessage.objects.filter(topic="whole").count() == 3


def test_enqueue_many_whose_second_statement_fails_writes_none_of_them(monkeypatch) -> None:
    """The same for tasks: enqueue_many() split into two INSERTs, the second refused."""
    monkeypatch.setattr(broker_enqueue, "INSERT_CHUNK", 2)
    with refusing("mysqlq_message"), pytest.raises(DatabaseError, match="refused"):
        tasks.record.enqueue_many([("a",), ("b",), ("boom",)])
    assert not Message.objects.exists()
    assert len(tasks.record.enqueue_many([("a",), ("b",), ("c",)])) == 3
    assert Message.objects.count() == 3


def test_apublish_and_apublish_many_from_async_code() -> None:
    from asgiref.sync import async_to_sync

    from django_mysqlq import Topic

    orders = Topic("async-orders")

    async def scenario() -> tuple[int, int]:
        first = await orders.apublish({"id": 1}, key="c1")
        count = await orders.apublish_many([{"id": 2}, {"id": 3}], keys=["c1", 7])
        return first, count

    first, count = async_to_sync(scenario)()
    rows = list(TopicMessage.objects.filter(topic="async-orders").order_by("id")
                .values_list("id", "key", "payload"))
    assert count == 2 and rows[0][0] == first
    assert [(key, text) for _, key, text in rows] == [
        ("c1", '{"id":1}'), ("c1", '{"id":2}'), ("7", '{"id":3}')]


def test_publish_many_refuses_an_endless_keys_iterable() -> None:
    """The keys were all read before their count was compared with the values': an
    endless iterable (itertools.count()) hung the call, taking memory as it went."""
    import itertools

    from django_mysqlq import Topic
    from django_mysqlq.exceptions import InvalidTaskOptions

    with pytest.raises(InvalidTaskOptions, match="2 payloads but more than 2 keys"):
        Topic("keyed").publish_many([1, 2], keys=itertools.count())
    with pytest.raises(InvalidTaskOptions, match="2 payloads but more than 2 keys"):
        Topic("keyed").publish_many([1, 2], keys=iter(["a", "b", "c"]))
    with pytest.raises(InvalidTaskOptions, match="3 payloads but 2 keys"):
        Topic("keyed").publish_many([1, 2, 3], keys=(k for k in ["a", "b"]))
    assert not TopicMessage.objects.filter(topic="keyed").exists()
    assert Topic("keyed").publish_many([1, 2], keys=iter(["a", 7])) == 2


def test_publish_many_gives_all_its_rows_one_publish_time() -> None:
    """2,500 messages take three INSERTs (1,000 rows a statement): each statement's
    UTC_TIMESTAMP(6) gave its rows their own time, three in one call. The docs (and a
    lookup's paging by publish time) say a publish_many() gives its rows one."""
    from django_mysqlq import Topic

    Topic("one_time").publish_many([{"i": i} for i in range(2500)])
    times = set(TopicMessage.objects.filter(topic="one_time").values_list(
        "published_at", flat=True))
    assert TopicMessage.objects.filter(topic="one_time").count() == 2500
    assert len(times) == 1, sorted(times)
    Topic("one_time").publish_many([{"i": i} for i in range(3)])  # (one statement: later)
    assert len(set(TopicMessage.objects.filter(topic="one_time").values_list(
        "published_at", flat=True))) == 2
