"""What publish refuses up front, so that nothing it accepts can fail every consumer: a
payload nested deeper than a worker parses back, one whose delivery would not fit the
server's ``max_allowed_packet``; and the largest and deepest payloads it accepts reach
a real worker's group and broadcast handlers."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from django_mysqlq import ArgumentEncodingError, PayloadTooLarge, Topic
from django_mysqlq.broker.topics import DELIVERY_ROW_BYTES
from django_mysqlq.conf import SettingsError, get_settings
from django_mysqlq.exceptions import InvalidTaskOptions
from django_mysqlq.models import TopicMessage
from django_mysqlq.payload import MAX_PUBLISHED_DEPTH
from tests.conftest import wait_for
from tests.packet_support import nested, server_packet
from tests.testapp import topic_handlers
from tests.testapp.models import GateRun

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 2**20
ENV = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.topic_handlers"}


def room() -> int:
    """The largest payload publish accepts (bytes of its JSON text, ASCII, no escapes)."""
    packet = server_packet()
    return max(packet // 2, packet - 64 * 1024) - DELIVERY_ROW_BYTES - 2


def test_a_payload_nested_deeper_than_a_worker_parses_is_refused_and_nothing_written():
    orders = Topic("orders")
    # 1,400 levels encode (the encoder's own limit is about 1,500) but don't parse back
    # in a worker: before, publish took them and every group's delivery went dead.
    for depth in (MAX_PUBLISHED_DEPTH + 1, 1_400, 100_000):
        with pytest.raises(ArgumentEncodingError,
                           match=rf"topic 'orders' is nested more than {MAX_PUBLISHED_DEPTH} "
                                 r"levels deep.*flatten it"):
            orders.publish(nested(depth))
    with pytest.raises(ArgumentEncodingError, match="nested more than"):
        orders.publish_many([{"ok": 1}, {"deep": nested(MAX_PUBLISHED_DEPTH)}])
    assert not TopicMessage.objects.exists()
    orders.publish(nested(MAX_PUBLISHED_DEPTH - 1, {"a": 1}))  # 500 containers: accepted
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ArgumentEncodingError, match="Circular reference"):
        orders.publish({"loop": loop})
    assert TopicMessage.objects.count() == 1


def test_a_payload_whose_delivery_would_pass_max_allowed_packet_is_refused(settings):
    """Only a site that raised MAX_PAYLOAD_BYTES near the packet can publish one: before,
    the insert went through and every group's pump then failed on it forever (1153), its
    worker's loop with it."""
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 64 * MiB}
    orders = Topic("orders")
    for size in (room() + 1, server_packet() - 1_000, server_packet() + 1_000):
        with pytest.raises(PayloadTooLarge, match=r"topic 'orders'.*max_allowed_packet"):
            orders.publish("x" * size)
    with pytest.raises(PayloadTooLarge, match="max_allowed_packet"):
        orders.publish_many(["small", "x" * (room() + 1)])
    assert not TopicMessage.objects.exists()


@pytest.mark.worker
def test_the_largest_and_deepest_payloads_publish_takes_reach_a_worker(settings,
                                                                       start_worker):
    settings.MYSQLQ = {**settings.MYSQLQ, "MAX_PAYLOAD_BYTES": 64 * MiB}
    worker = start_worker("--groups", "billing", env=ENV)
    wait_for(lambda: "started: queues=" in worker.output(), timeout=60,
             message="the worker to start")
    label = "publish-limits"
    base = {"label": label, "seq": 0, "pad": ""}
    big = {**base, "pad": "p" * (room() - len(json.dumps(base, separators=(",", ":"))) - 20)}
    # The key's longest form: its characters take the most room in the delivery's row.
    topic_handlers.ledger.publish(big, key="\u00e9" * 190)
    topic_handlers.ledger.publish({"label": label, "seq": 1,
                                   "deep": nested(MAX_PUBLISHED_DEPTH - 2)}, key="d")

    def handled(who: str) -> set[int]:
        return set(GateRun.objects.filter(label__startswith=label, key__startswith=who,
                                          edge="end", outcome="ok")
                   .values_list("seq", flat=True))

    wait_for(lambda: handled("billing:") == {0, 1} and handled("broadcast:") == {0, 1},
             timeout=120, message="the group and the broadcast handler to get both")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()
    assert "max_allowed_packet" not in worker.output()


@pytest.mark.parametrize("values", ["abc", {"a": 1}, 5, None, b"xy"])
def test_publish_many_refuses_a_single_value_for_its_list(values):
    """A str or a dict was taken apart into one message per character or key; a number
    raised a bare TypeError."""
    with pytest.raises(InvalidTaskOptions, match=r"publish_many\(\) takes values as a list"):
        Topic("orders").publish_many(values)
    with pytest.raises(InvalidTaskOptions, match=r"publish_many\(\) takes keys as a list"):
        Topic("orders").publish_many([1, 2], keys="ab")
    assert not TopicMessage.objects.exists()


@pytest.mark.parametrize("name", ["a\nb", "a\tb", "a\x00b", "a\u00a0b", "line\r"])
def test_topic_and_group_names_with_unprintable_characters_are_refused(name):
    with pytest.raises(InvalidTaskOptions, match=r"topic name .*unprintable characters"):
        Topic(name)
    with pytest.raises(InvalidTaskOptions, match=r"group name .*unprintable characters"):
        Topic("orders").subscribe(group=name)


@pytest.mark.parametrize("backoff", [5, 2.5, "10,30", None])
def test_a_retry_backoff_that_is_not_a_list_is_refused_saying_so(backoff, settings):
    if backoff is not None:
        with pytest.raises(InvalidTaskOptions, match=r"must be a list of 1 to 100 delays"):
            Topic("orders").subscribe(group="g", retry_backoff=backoff)
    settings.MYSQLQ = {**settings.MYSQLQ, "TOPIC_RETRY_BACKOFF": backoff or 7}
    with pytest.raises(SettingsError, match=r"TOPIC_RETRY_BACKOFF.*must be a list"):
        get_settings()
