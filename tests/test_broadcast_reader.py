"""The broadcast reader in-process, against the real server: a topic whose read fails holds
back none of its other topics. (The same with a real worker: tests/test_topics_workers.py.)"""

from __future__ import annotations

import logging
import threading

import pytest
from django.db import connection

from django_mysqlq import Topic
from django_mysqlq.models import TopicState
from django_mysqlq.topics import Subscription, TopicEvent
from django_mysqlq.worker.topics import BroadcastReader
from tests.conftest import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

#: How a failed read's line starts (then the topic and the error).
FAILED = "Broadcast reader: reading topic {!r} failed (logged once until it reads again): "
#: A topic row's last_offset set by hand to BIGINT's largest value: sequencing its next
#: message fails on the server (1264, out of range), at every poll, until it is put back.
WEDGED = 2**63 - 1


def reader_of(*names: str) -> tuple[BroadcastReader, list[TopicEvent]]:
    """A broadcast reader of ``names`` (read in that order) started at their latest
    offsets, and what its handlers got."""
    got: list[TopicEvent] = []
    reader = BroadcastReader([Subscription(name, got.append, None) for name in names],
                             threading.Event(), poll=0.1)
    reader.begin()
    return reader, got


def payloads(got: list[TopicEvent]) -> list[tuple[str, object]]:
    return [(event.topic, event.payload) for event in got]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_topic_whose_read_fails_holds_back_none_of_the_others(caplog) -> None:
    """A real server error on the first topic read (its row tampered, see ``WEDGED``).
    Before, the error ended the whole poll: the topic after it was never read. Now it is
    logged once, the other topic's messages reach the handlers, and the first one is read
    again once its row is put back."""
    reader, got = reader_of("wedged", "flowing")
    TopicState.objects.filter(name="wedged").update(last_offset=WEDGED)
    Topic("wedged").publish("w")
    Topic("flowing").publish_many(["a", "b"])
    with caplog.at_level(logging.WARNING, "django_mysqlq"):
        assert reader.read_once() == 2
        assert reader.read_once() == 0
        assert reader.read_once() == 0
    assert payloads(got) == [("flowing", "a"), ("flowing", "b")]
    [line] = warnings(caplog)
    assert line.startswith(FAILED.format("wedged"))
    assert "1264" in line and "The other topics go on" in line
    caplog.clear()
    TopicState.objects.filter(name="wedged").update(last_offset=0)
    with caplog.at_level(logging.WARNING, "django_mysqlq"):
        assert reader.read_once() == 1
    assert payloads(got)[2:] == [("wedged", "w")]
    assert warnings(caplog) == ["Broadcast reader: topic 'wedged' reads again."]


def test_a_read_that_leaves_no_connection_ends_the_poll_and_its_topic_goes_last(
        caplog) -> None:
    """The reader's connection killed by the server (KILL): the first topic's read fails
    and the connection is closed; the poll ends there (the others would fail the same
    way), and the next one reconnects and reads that topic last."""
    reader, got = reader_of("first", "second")
    Topic("first").publish("f")
    Topic("second").publish("s")
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        [(session,)] = cursor.fetchall()
    killer = raw_connection()
    try:
        killer.cursor().execute(f"KILL {int(session)}")
    finally:
        killer.close()
    with caplog.at_level(logging.WARNING, "django_mysqlq"):
        assert reader.read_once() == 0
    assert connection.connection is None and reader.order == ["second", "first"]
    [line] = warnings(caplog)
    assert line.startswith(FAILED.format("first"))
    assert "It left no connection" in line
    assert reader.read_once() == 2
    assert payloads(got) == [("second", "s"), ("first", "f")]
