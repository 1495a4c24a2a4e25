"""Topics without workers: publish in the caller's transaction, payload errors, offsets
given in commit order (an open publisher transaction is never skipped), the pump turning
messages into deliveries once per group, groups' start, subscribe() arguments."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time

import pytest
from django.db import connection, connections, transaction

from django_mysqlq import ArgumentEncodingError, PayloadTooLarge, Topic, broker
from django_mysqlq.broker import Pumped
from django_mysqlq.exceptions import InvalidTaskOptions
from django_mysqlq.models import Message, TopicDelivery, TopicGroup, TopicMessage, TopicState
from django_mysqlq.topicnames import delivery_task_name, group_queue

pytestmark = pytest.mark.django_db(transaction=True)


def spec(topic: str, group: str, start: str = "latest", on_dead: str = "skip"
         ) -> broker.GroupSpec:
    return broker.GroupSpec(topic=topic, group=group, queue=group_queue(group),
                            task_name=delivery_task_name(topic, group), on_dead=on_dead,
                            max_attempts=3, retry_backoff=0.1, timeout=None, start=start)


def offsets(topic: str) -> dict[int, int | None]:
    return dict(TopicMessage.objects.filter(topic=topic).values_list("id", "offset"))


def test_publish_joins_the_callers_transaction() -> None:
    orders = Topic("orders")
    with transaction.atomic():
        orders.publish({"id": 1}, key="c1")
        orders.publish_many([{"id": 2}, {"id": 3}], keys=["c1", None])
        assert TopicMessage.objects.filter(topic="orders").count() == 3
        transaction.set_rollback(True)
    assert TopicMessage.objects.filter(topic="orders").count() == 0
    with transaction.atomic():
        orders.publish({"id": 4}, key=7)
    row = TopicMessage.objects.get(topic="orders")
    assert (row.key, row.offset, row.payload) == ("7", None, '{"id":4}')
    assert broker.sequence("orders") == 1
    assert offsets("orders") == {row.pk: 1}


def test_payload_errors_name_the_topic_and_write_nothing() -> None:
    orders = Topic("orders")
    with pytest.raises(ArgumentEncodingError, match=r"topic 'orders'.*dict key 1"):
        orders.publish({1: "x"})
    with pytest.raises(ArgumentEncodingError, match=r"topic 'orders'.*JSON"):
        orders.publish({"when": object()})
    with pytest.raises(ArgumentEncodingError):
        orders.publish_many([{"ok": 1}, float("nan")])
    with pytest.raises(PayloadTooLarge, match="MAX_PAYLOAD_BYTES"):
        orders.publish("x" * 1_000_001)
    with pytest.raises(InvalidTaskOptions, match="2 payloads but 1 keys"):
        orders.publish_many([1, 2], keys=["a"])
    with pytest.raises(InvalidTaskOptions, match="key"):
        orders.publish(1, key="")
    with pytest.raises(InvalidTaskOptions, match="topic name"):
        Topic("a,b")
    assert not TopicMessage.objects.exists()


def test_a_tuple_payload_is_taken_as_a_list_as_task_arguments_are() -> None:
    """JSON has no tuples: as enqueue() takes a tuple argument as the list it becomes
    (docs/tasks.md), publish takes a tuple payload, and docs/streams.md says so."""
    from pathlib import Path

    orders = Topic("orders")
    orders.publish((1, 2), key=5)
    orders.publish_many([{"pair": ("a", "b")}])
    assert list(TopicMessage.objects.filter(topic="orders").order_by("id").values_list(
        "payload", flat=True)) == ["[1,2]", '{"pair":["a","b"]}']
    docs = " ".join((Path(__file__).resolve().parent.parent / "docs" / "streams.md")
                    .read_text().split())
    assert "a tuple is taken as the list it becomes, as task arguments are" in docs


def test_publish_many_splits_to_fit_max_allowed_packet() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = int(cursor.fetchone()[0])
    size = 900_000
    count = packet // size + 3  # more than one statement can carry
    assert Topic("big").publish_many(["y" * size] * count) == count
    assert TopicMessage.objects.filter(topic="big").count() == count
    assert broker.sequence("big") == count


def test_an_open_publisher_is_never_skipped_by_a_later_commit() -> None:
    """Id 1 is inserted first and stays uncommitted while id 2 commits: id 2 gets offset 1
    (it is the one visible), id 1 waits, then gets offset 2 once committed. A reader that
    read 'after 1' still finds it."""
    inserted, release, done = threading.Event(), threading.Event(), threading.Event()

    def slow_publisher() -> None:
        try:
            with transaction.atomic():
                Topic("race").publish("early")
                inserted.set()
                release.wait(20)
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=slow_publisher)
    thread.start()
    assert inserted.wait(20)
    Topic("race").publish("late")
    assert broker.sequence("race") == 1  # the open row is passed over, not waited for
    by_payload = {row.payload: row.offset for row in TopicMessage.objects.filter(topic="race")}
    assert by_payload == {'"late"': 1}  # the open row is not visible here at all
    seen = [row[2] for row in broker.read_after("race", 0, 10)]
    assert seen == ['"late"']
    release.set()
    assert done.wait(20)
    thread.join()
    assert broker.sequence("race") == 1
    early = TopicMessage.objects.get(topic="race", payload='"early"')
    late = TopicMessage.objects.get(topic="race", payload='"late"')
    assert early.pk < late.pk and early.offset == 2 and late.offset == 1
    assert [row[2] for row in broker.read_after("race", 1, 10)] == ['"early"']


@pytest.mark.parametrize("sequencers", [0, 3])
def test_concurrent_publishers_and_a_reader_see_every_message_once_in_offset_order(
        sequencers: int) -> None:
    """4 publishers with transactions of random length and a rolled-back one now and then,
    a sequencer and a reader running all along: the reader, always reading after the last
    offset it saw, gets every committed message exactly once, offsets dense 1..N.

    With ``sequencers``, the reader and that many more threads race with the members'
    ways (the topic's row ``SKIP LOCKED``, the look for unsequenced rows first):
    ``try_sequence``, and groups' pumps that sequence in their own transaction, as four
    groups' members do: the offsets stay dense and in commit order."""
    rng = random.Random(7)
    plans = [[(rng.random() < 0.1, rng.uniform(0, 0.01), rng.randint(1, 3))
              for _ in range(40)] for _ in range(4)]
    committed: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def publisher(number: int) -> None:
        try:
            for index, (rollback, pause, many) in enumerate(plans[number]):
                values = [f"p{number}-{index}-{k}" for k in range(many)]
                with transaction.atomic():
                    Topic("busy").publish_many(values)
                    time.sleep(pause)
                    transaction.set_rollback(rollback)
                if not rollback:
                    with lock:
                        committed.extend(values)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    seen: list[tuple[int, str]] = []
    skipped: list[int] = []

    def sequence() -> None:
        if not sequencers:
            broker.sequence("busy", batch=7)
        elif broker.try_sequence("busy", batch=7) is None:
            skipped.append(1)

    def racer(number: int) -> None:
        try:
            group = spec("busy", f"racer{number}", start="earliest")
            while not stop.is_set():
                if number % 2:
                    sequence()
                elif broker.pump_group(group, batch=50, window=10**6, sequence=True).busy:
                    skipped.append(1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    def reader() -> None:
        try:
            position = 0
            while True:
                finished = stop.is_set()
                if finished:  # (a skipped round proves nothing is left: wait for it)
                    broker.sequence("busy", batch=7)
                else:
                    sequence()
                rows = broker.read_after("busy", position, 50)
                for row in rows:
                    seen.append((row.offset, str(row.payload).strip('"')))
                    position = row.offset
                if finished and not rows:
                    return
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    if sequencers:
        broker.sequence("busy")  # the topic's row, as a worker's start makes it
        for number in range(sequencers):
            broker.create_group(spec("busy", f"racer{number}", start="earliest"))
    threads = [threading.Thread(target=publisher, args=(n,)) for n in range(4)]
    racers = [threading.Thread(target=racer, args=(n,)) for n in range(sequencers)]
    reading = threading.Thread(target=reader)
    reading.start()
    for thread in threads + racers:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    for thread in racers:
        thread.join(60)
    reading.join(60)
    assert not errors
    assert bool(skipped) == bool(sequencers)  # (hundreds of busy rounds, measured)
    for number in range(0, sequencers, 2):  # the groups that sequenced in their pumps
        pumped = sorted(TopicDelivery.objects.filter(
            topic="busy", group_name=f"racer{number}").values_list("offset", flat=True))
        assert pumped and pumped == list(range(1, len(pumped) + 1))
    assert [offset for offset, _ in seen] == list(range(1, len(committed) + 1))
    assert sorted(text for _, text in seen) == sorted(committed)
    # One publisher's messages keep its order.
    for number in range(4):
        mine = [text for _, text in seen if text.startswith(f"p{number}-")]
        assert mine == [text for text in committed if text.startswith(f"p{number}-")]


def test_try_sequence_looks_first_and_never_waits_for_the_topic_row() -> None:
    """The members' sequencing: 0 without a transaction when nothing lacks an offset,
    None at once while another round holds the topic's row, and the topic's row made
    when there is none yet."""
    topic = Topic("skipping")
    topic.publish("first")
    assert broker.try_sequence("skipping") == 1  # no row yet: the waiting round made it
    assert broker.try_sequence("skipping") == 0
    topic.publish_many(["a", "b"])
    locked, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            TopicState.objects.select_for_update().get(name="skipping")
            locked.set()
            release.wait(20)
        connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert locked.wait(20)
    started = time.monotonic()
    assert broker.try_sequence("skipping") is None  # busy: not waited for
    assert time.monotonic() - started < 1
    assert broker.last_offset("skipping") == 1
    release.set()
    thread.join()
    assert broker.try_sequence("skipping") == 2
    assert sorted(offsets("skipping").values()) == [1, 2, 3]


def test_a_draining_pump_waits_for_room_for_half_a_batch() -> None:
    """``least``: while deliveries wait, the pump waits until there is room for that
    many, then fills it in one go; an empty queue is always filled. pump_group says
    whether the group was behind its topic's last offset."""
    topic = Topic("halves")
    group = spec("halves", "drain")
    broker.create_group(group)
    topic.publish_many(list(range(10)))
    broker.sequence("halves")
    assert broker.pump_group(group, batch=4, window=10, least=5) == Pumped(4, True, False)
    assert broker.pump_group(group, batch=4, window=10, least=5) == Pumped(4, True, False)  # room 6
    assert broker.pump_group(group, batch=4, window=10, least=5) == Pumped(0, True, False)  # room 2
    first = Message.objects.filter(queue="group:drain").order_by("id")[:5]
    Message.objects.filter(pk__in=[m.pk for m in first]).delete()
    assert broker.pump_group(group, batch=4, window=10, least=5) == Pumped(2, True, False)
    assert broker.position("halves", "drain") == 10
    assert broker.pump_group(group, batch=4, window=10, least=5) == Pumped(0, False, False)
    nobody = spec("halves", "nobody")
    assert broker.pump_group(nobody, batch=4, window=10) == Pumped(0, False, False)


def test_a_caught_up_group_sequences_and_pumps_in_one_transaction() -> None:
    """pump_group(sequence=True): a group with every sequenced message stamps the new
    ones and pumps them at once; while another round holds the topic's row it says busy
    (without waiting) and makes nothing; a group still behind never sequences."""
    topic = Topic("oneshot")
    first, second = spec("oneshot", "first"), spec("oneshot", "second")
    broker.sequence("oneshot")
    broker.create_group(first)
    broker.create_group(second)
    topic.publish_many(["a", "b", "c"])
    assert broker.pump_group(first, batch=10, window=10) == Pumped(0, False, False)  # not asked
    assert broker.pump_group(first, batch=10, window=10, sequence=True) == Pumped(3, False, False)
    assert broker.last_offset("oneshot") == 3 and broker.position("oneshot", "first") == 3
    topic.publish("d")
    # "second" is behind (offsets 1-3): it pumps those and leaves "d" unsequenced.
    assert broker.pump_group(second, batch=10, window=10, sequence=True) == Pumped(3, True, False)
    assert broker.last_offset("oneshot") == 3
    locked, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            TopicState.objects.select_for_update().get(name="oneshot")
            locked.set()
            release.wait(20)
        connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert locked.wait(20)
    started = time.monotonic()
    assert broker.pump_group(first, batch=10, window=10, sequence=True) == Pumped(0, False, True)
    assert time.monotonic() - started < 1
    assert broker.position("oneshot", "first") == 3  # rolled back with nothing done
    release.set()
    thread.join()
    assert broker.pump_group(first, batch=10, window=10, sequence=True) == Pumped(1, False, False)
    assert broker.pump_group(second, batch=10, window=10, sequence=True) == Pumped(1, True, False)
    assert sorted(TopicDelivery.objects.filter(topic="oneshot").values_list(
        "group_name", "offset")) == [("first", 1), ("first", 2), ("first", 3), ("first", 4),
                                     ("second", 1), ("second", 2), ("second", 3),
                                     ("second", 4)]


def test_the_pump_makes_one_delivery_per_group_and_moves_the_position() -> None:
    topic = Topic("pumped")
    billing, audit = spec("pumped", "billing"), spec("pumped", "audit", on_dead="hold")
    topic.publish("before the groups")
    broker.sequence("pumped")
    broker.create_group(billing)
    broker.create_group(audit)
    broker.create_group(billing)  # a second start changes nothing
    assert broker.position("pumped", "billing") == 1
    topic.publish_many([{"n": n} for n in range(5)], keys=["k1", "k2", "k1", None, "k1"])
    broker.sequence("pumped")
    assert broker.pump(billing, batch=3, window=100) == 3
    assert broker.pump(billing, batch=3, window=100) == 2
    assert broker.pump(billing, batch=3, window=100) == 0
    assert broker.pump(audit, batch=10, window=100) == 5
    assert broker.position("pumped", "billing") == broker.position("pumped", "audit") == 6
    links = TopicDelivery.objects.filter(topic="pumped")
    assert sorted(links.filter(group_name="billing").values_list("offset", flat=True)) == \
        [2, 3, 4, 5, 6]
    billing_messages = Message.objects.filter(queue="group:billing").order_by("id")
    assert [m.status for m in billing_messages] == ["ready", "ready", "blocked", "ready",
                                                    "blocked"]
    assert [m.gate_key for m in billing_messages] == ["pumped:k1", "pumped:k2", "pumped:k1",
                                                      None, "pumped:k1"]
    first = billing_messages[0]
    assert first.task_name == "topic:pumped:billing"
    args = first.decoded_payload()
    assert args["args"] == [{"n": 0}] and args["kwargs"]["offset"] == 2
    assert args["kwargs"]["key"] == "k1"
    assert {link.message_id for link in links.filter(group_name="billing")} == \
        {m.pk for m in billing_messages}
    assert set(Message.objects.filter(queue="group:audit").values_list("gate_mode", flat=True)
               ) == {"hold", None}


def test_the_pump_pauses_while_the_window_is_full_and_skips_a_locked_group() -> None:
    topic = Topic("windowed")
    group = spec("windowed", "slow")
    broker.create_group(group)
    topic.publish_many(list(range(10)))
    broker.sequence("windowed")
    assert broker.pump(group, batch=100, window=4) == 4
    assert broker.pump(group, batch=100, window=4) == 0
    Message.objects.filter(queue="group:slow").delete()
    # Another member holds the group's row: this one skips it instead of waiting.
    locked, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            TopicGroup.objects.select_for_update().get(topic="windowed", group_name="slow")
            locked.set()
            release.wait(20)
        connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert locked.wait(20)
    started = time.monotonic()
    assert broker.pump(group, batch=100, window=4) == 0
    assert time.monotonic() - started < 1
    release.set()
    thread.join()
    assert broker.pump(group, batch=100, window=100) == 6


def test_a_group_starts_at_the_latest_or_the_earliest_message() -> None:
    Topic("starts").publish_many(["a", "b"])
    broker.sequence("starts")
    broker.create_group(spec("starts", "late"))
    broker.create_group(spec("starts", "early", start="earliest"))
    assert broker.position("starts", "late") == 2
    assert broker.position("starts", "early") == 0
    assert TopicGroup.objects.get(group_name="early").start == "earliest"
    broker.create_group(spec("never-published", "fresh"))
    assert broker.position("never-published", "fresh") == 0


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({}, "neither"),
    ({"group": "g", "broadcast": True}, "both"),
    ({"group": "a:b"}, "group name"),
    ({"group": "g", "start": "middle"}, "start"),
    ({"group": "g", "on_dead": "drop"}, "on_dead"),
    ({"group": "g", "max_attempts": 0}, "max_attempts"),
    ({"group": "g", "retry_backoff": []}, "retry_backoff"),
    ({"broadcast": True, "max_attempts": 3}, "never retried"),
    ({"broadcast": "yes"}, "True or False"),
])
def test_subscribe_refuses_bad_arguments(kwargs: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidTaskOptions, match=problem):
        Topic("checked").subscribe(**kwargs)  # type: ignore[arg-type]


def test_a_task_on_a_group_queue_is_a_system_check_error() -> None:
    from django_mysqlq import queue_task
    from django_mysqlq.checks import check_group_queues
    from django_mysqlq.registry import registry

    assert [e.id for e in check_group_queues()] == []

    @queue_task(queue="group:billing", name="tests.intruder")
    def intruder() -> None: ...

    try:
        errors = check_group_queues()
        assert [e.id for e in errors] == ["django_mysqlq.E007"]
        assert "tests.intruder" in errors[0].msg
    finally:
        registry._tasks.pop("tests.intruder", None)


def test_topic_published_after_commit_and_topic_pumped_with_their_documented_arguments(
        ) -> None:
    """docs/streams.md: ``topic_published`` (sender: the topic; ``count``) after the
    publisher's commit, never for a rollback; ``topic_pumped`` (``group``, ``count``)."""
    from django_mysqlq.signals import topic_published, topic_pumped

    seen: list[tuple[str, str, dict]] = []

    def published(sender, **kwargs):
        seen.append(("published", sender, {k: v for k, v in kwargs.items() if k != "signal"}))

    def pumped(sender, **kwargs):
        seen.append(("pumped", sender, {k: v for k, v in kwargs.items() if k != "signal"}))

    topic_published.connect(published)
    topic_pumped.connect(pumped)
    try:
        signalled = Topic("signalled")
        billing = spec("signalled", "billing")
        broker.create_group(billing)
        with transaction.atomic():
            signalled.publish({"n": 0})
            signalled.publish_many([{"n": 1}, {"n": 2}])
            assert seen == []  # not before the commit
        with transaction.atomic():
            signalled.publish({"n": 3})
            transaction.set_rollback(True)
        assert seen == [("published", "signalled", {"count": 1}),
                        ("published", "signalled", {"count": 2})]
        broker.sequence("signalled")
        assert broker.pump(billing, batch=10, window=100) == 3
        assert seen[2:] == [("pumped", "signalled", {"group": "billing", "count": 3})]
    finally:
        topic_published.disconnect(published)
        topic_pumped.disconnect(pumped)


def test_the_sequencer_reads_its_backlog_in_index_order_without_a_sort() -> None:
    """The sequencer's pick reads the offset index in its own order (NULL offsets, then
    id): no filesort of the whole backlog per round. The rows it stamps are still the
    lowest ids, in id order, with other topics' rows interleaved."""
    from django_mysqlq.broker.topics import UNSEQUENCED_IN_INDEX_ORDER_SQL

    for chunk in range(3):
        Topic("backlog").publish_many([{"n": chunk * 700 + n} for n in range(700)])
        Topic("other-backlog").publish_many([{"n": n} for n in range(300)])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + UNSEQUENCED_IN_INDEX_ORDER_SQL, ["backlog", 1000])
        columns = [column[0] for column in cursor.description]
        plan = dict(zip(columns, cursor.fetchone(), strict=True))
    assert plan["key"] == "mysqlq_tmsg_offset"
    assert "filesort" not in str(plan["Extra"]).lower()
    assert broker.sequence("backlog", batch=1000) == 2100
    stamped = offsets("backlog")  # id -> offset
    assert [stamped[id_] for id_ in sorted(stamped)] == list(range(1, 2101))
    assert TopicMessage.objects.filter(topic="other-backlog", offset__isnull=True).count() == 900


def test_the_sequencer_sorts_when_the_index_order_is_not_ascending() -> None:
    """Should a server ever hand the index back in another order, the pick reads again
    with ORDER BY id: never stamps out of id order. (Its ids alone, sorted; then which
    of them were sequenced before, by primary key.)"""
    from django_mysqlq.broker.topics import UNSEQUENCED_SQL, unsequenced_ids

    cleared = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)

    class Cursor:
        def __init__(self) -> None:
            self.statements: list[str] = []

        def execute(self, sql: str, params: list[object]) -> None:
            self.statements.append(sql)

        def fetchall(self) -> list[tuple[object, ...]]:
            return {1: [(5, None), (3, None), (9, cleared)], 2: [(3,), (5,), (9,)],
                    3: [(9, cleared)]}[len(self.statements)]

    cursor = Cursor()
    assert unsequenced_ids(cursor, "t", 3) == ([3, 5, 9], [(9, cleared)])
    assert cursor.statements[1] == UNSEQUENCED_SQL
    assert "sequenced_at IS NOT NULL" in cursor.statements[2]
    ascending = Cursor()
    ascending.fetchall = lambda: [(3, None), (5, cleared), (9, None)]  # type: ignore[method-assign]
    assert unsequenced_ids(ascending, "t", 3) == ([3, 5, 9], [(5, cleared)])
    assert len(ascending.statements) == 1


def test_a_publish_wakes_the_groups_its_rows_name_even_unsubscribed_here(monkeypatch) -> None:
    """A web process that only publishes may never import the handlers' module: its
    subscriptions know no group of the topic, and its publishes woke no member (they
    found the messages at the end of a park). The group rows name them; they are read
    once per GROUP_QUEUES_SECONDS, not at every publish."""
    from django.test.utils import CaptureQueriesContext

    from django_mysqlq.broker import topics as broker_topics

    woken: list[list[str]] = []
    monkeypatch.setattr(broker_topics, "wake", lambda queues, alias: woken.append(queues))
    monkeypatch.setattr(broker_topics, "_group_queues", {})
    for name in ("billing", "audit"):
        broker.create_group(broker.GroupSpec(
            topic="remote", group=name, queue=group_queue(name),
            task_name=delivery_task_name("remote", name), on_dead="skip", max_attempts=3,
            retry_backoff=1.0, timeout=None))
    Topic("remote").publish({"n": 1})
    assert woken == [["group:audit", "group:billing"]]
    with CaptureQueriesContext(connection) as queries:
        Topic("remote").publish_many([{"n": 2}, {"n": 3}])
    assert woken[-1] == ["group:audit", "group:billing"]
    assert not any("mysqlq_topic_group" in q["sql"] for q in queries.captured_queries)
    monkeypatch.setattr(broker_topics, "GROUP_QUEUES_SECONDS", 0.0)
    Topic("quiet").publish({"n": 1})  # a topic without groups wakes nobody
    assert woken[-1] == []


def test_the_leader_s_look_for_unsequenced_topics_goes_on_where_it_stopped(monkeypatch
                                                                          ) -> None:
    """Each call looked at the first UNREAD_TOPICS_PER_CALL names: a topic past them
    was never sequenced by the leader (and never pruned, retention going by offset)."""
    from django_mysqlq.broker import topics as broker_topics

    monkeypatch.setattr(broker_topics, "UNREAD_TOPICS_PER_CALL", 2)
    monkeypatch.setattr(broker_topics, "_unread_after", {})
    names = [f"unread{n}" for n in range(5)]
    for name in names:
        Topic(name).publish({"n": 1})
    alias = connection.alias
    calls = [broker_topics._topics_with_unsequenced(alias) for _ in range(3)]
    assert calls == [["unread0", "unread1"], ["unread2", "unread3"], ["unread4"]]
    broker.sequence("unread1")  # no longer unsequenced: looked at, not found
    assert broker_topics._topics_with_unsequenced(alias) == ["unread0"]  # round again
