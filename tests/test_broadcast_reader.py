"""The broadcast reader in-process, against the real server: a topic whose read fails holds
back none of its other topics, and a read is bounded by the bytes of its payloads as well
as by count. (A failing topic with a real worker: tests/test_topics_workers.py.)"""

from __future__ import annotations

import logging
import threading

import pytest
from django.db import OperationalError, connection

from django_mysqlq import Topic, broker
from django_mysqlq.broker import oversized
from django_mysqlq.models import TopicState
from django_mysqlq.topics import Subscription, TopicEvent
from django_mysqlq.worker import topics
from django_mysqlq.worker.topics import BroadcastReader
from tests.conftest import raw_connection
from tests.topic_ops_support import holding_topic_row

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


def test_a_read_takes_the_first_messages_whose_payloads_fit_its_bytes(monkeypatch) -> None:
    """Payloads of 102, 102, 102, 1,002 and 3 bytes (their JSON) and a budget of 250:
    the first two, then the third alone, then the big one alone (one message at least),
    then the last. A payload past one row's room is not read, and counts nothing."""
    Topic("sized").publish_many(["a" * 100, "b" * 100, "c" * 100, "d" * 1000, "e"])
    broker.sequence("sized")

    def offsets(after: int) -> list[int]:
        return [row.offset for row in broker.read_after("sized", after, 500, max_bytes=250)]

    assert [offsets(after) for after in (0, 2, 3, 4, 5)] == [[1, 2], [3], [4], [5], []]
    assert [row.offset for row in broker.read_after("sized", 0, 3)] == [1, 2, 3]  # no bound
    monkeypatch.setattr(oversized, "row_room", lambda alias=None: 500)
    rows = broker.read_after("sized", 2, 500, max_bytes=250)
    assert [(row.offset, row.payload is None) for row in rows] == [
        (3, False), (4, True), (5, False)]


def test_the_reader_gets_every_message_in_order_across_byte_bounded_reads(
        monkeypatch) -> None:
    """The same messages through a reader whose budget is 250 bytes: one read returns
    only the prefix that fits, and every message comes, in order, over the polls."""
    monkeypatch.setattr(topics, "BROADCAST_BYTES", 250)
    reader, got = reader_of("sized")
    values = ["a" * 100, "b" * 100, "c" * 100, "d" * 1000, "e"]
    Topic("sized").publish_many(values)
    counts = [reader.read_once() for _ in range(5)]
    assert counts == [2, 1, 1, 1, 0]
    assert [event.payload for event in got] == values
    assert [event.offset for event in got] == [1, 2, 3, 4, 5]


def test_handlers_that_raise_anything_or_are_async_in_disguise_leave_the_reader_going(
        caplog) -> None:
    """A broadcast handler's SystemExit (or an async one's CancelledError) used to end the
    reader's thread: the process heard no more broadcasts, and nothing said so. An async
    handler under a plain decorator returned its coroutine unawaited: it never ran."""
    import asyncio
    import functools

    heard: list[object] = []

    def exits(event: TopicEvent) -> None:
        raise SystemExit(3)

    async def cancelled(event: TopicEvent) -> None:
        raise asyncio.CancelledError

    async def hears(event: TopicEvent) -> None:
        heard.append(event.payload)

    @functools.wraps(hears)
    def plain(event: TopicEvent) -> object:
        return hears(event)

    reader = BroadcastReader([Subscription("noisy", handler, None)
                              for handler in (exits, cancelled, plain)],
                             threading.Event(), poll=0.1)
    reader.begin()
    Topic("noisy").publish_many([1, 2])
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        assert reader.read_once() == 2
    assert heard == [1, 2]
    failed = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failed) == 4 and all(line.startswith("Broadcast handler ") for line in failed)
    Topic("noisy").publish(3)
    assert reader.read_once() == 1 and heard == [1, 2, 3]


def test_a_row_changed_by_hand_is_skipped_and_the_reader_goes_on(caplog) -> None:
    """A payload that is no single JSON value ('' reads as none) ended the reader's
    thread with an IndexError; so did a zero publish time (read as None)."""
    reader, got = reader_of("tampered")
    Topic("tampered").publish_many([{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}])
    conn = raw_connection()
    try:
        cursor = conn.cursor()
        changes = [("payload", "", 1), ("payload", "1, 2", 2),
                   ("published_at", "0000-00-00 00:00:00", 3)]
        for column, value, n in changes:
            cursor.execute(f"UPDATE mysqlq_topic_message SET {column} = %s WHERE topic = "
                           "'tampered' AND payload = %s", [value, f'{{"n":{n}}}'])
            assert cursor.rowcount == 1
    finally:
        conn.close()
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        assert reader.read_once() == 4
    assert payloads(got) == [("tampered", {"n": 4})]
    skipped = [r.getMessage() for r in caplog.records if "changed by hand" in r.getMessage()]
    assert len(skipped) == 3, skipped
    Topic("tampered").publish({"n": 5})
    assert reader.read_once() == 1 and payloads(got)[-1] == ("tampered", {"n": 5})


def test_a_reader_starting_while_another_session_stamps_the_topic_starts_after_it(
        settings) -> None:
    """A process started beside one stamping the topic's backlog (its row held for that
    round) read the last offset at once, from before the backlog, and heard messages
    published before it began (a fresh-clone CI's two-database broadcast test heard
    them). It now waits for the round, then starts after the backlog."""
    settings.MYSQLQ = {**settings.MYSQLQ, "UPKEEP_LOCK_WAIT_SECONDS": 10}  # (room: a late timer)
    backlog = Topic("start_race")
    backlog.publish_many([{"seq": seq} for seq in range(3)])  # no worker: no offsets yet
    stranger = holding_topic_row("start_race")
    release = threading.Timer(0.5, stranger.conn.rollback)
    release.start()
    try:
        reader, got = reader_of("start_race")
    finally:
        release.join()
        stranger.release()
    assert reader.positions["start_race"] == broker.last_offset("start_race")
    backlog.publish_many([{"seq": seq} for seq in range(3, 6)])
    reader.read_once()
    assert [event.payload["seq"] for event in got] == [3, 4, 5]


def test_a_reader_starts_after_its_bounded_wait_for_a_row_a_stranger_keeps(
        settings, caplog) -> None:
    """A row kept longer than ``UPKEEP_LOCK_WAIT_SECONDS`` does not hold the start up: one
    warning says what the subscribers may hear, and the session's lock waits are its own
    again."""
    settings.MYSQLQ = {**settings.MYSQLQ, "UPKEEP_LOCK_WAIT_SECONDS": 1}
    Topic("start_kept").publish({"seq": 0})
    stranger = holding_topic_row("start_kept")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@session.innodb_lock_wait_timeout")
            before = cursor.fetchone()
        with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
            reader, _ = reader_of("start_kept")
    finally:
        stranger.release()
    assert reader.positions["start_kept"] == 0
    assert warnings(caplog) == [
        "Topic 'start_kept': another session held its row for 1 s as this process started "
        "(a transaction left open? see information_schema.INNODB_TRX): its broadcast "
        "subscribers and new groups start at the last offset given out, so messages "
        "published before the start that get theirs later reach them too."]
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@session.innodb_lock_wait_timeout")
        assert cursor.fetchone() == before


def test_a_start_cut_off_by_a_lost_connection_leaves_none_to_fail_the_next() -> None:
    """The reader begins on the topics' database, whichever database its worker serves;
    that worker's error handling closes its own database's broken connection only, so a
    dead one to the topics' failed every later try: the process never started. The
    reader's start closes it."""
    Topic("cut_off").publish({"seq": 0})
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        [own] = cursor.fetchone()
    killer = raw_connection()
    killer.cursor().execute("KILL %s", [own])
    killer.close()
    with pytest.raises(OperationalError):
        reader_of("cut_off")
    reader, _ = reader_of("cut_off")
    assert reader.positions["cut_off"] == broker.last_offset("cut_off") == 1


def test_a_start_stamps_the_messages_before_it_and_not_the_later_ones() -> None:
    """A start (a reader's, a new group's) waits until the messages inserted before it
    have offsets, round after round of a backlog, then ends: a publisher outpacing the
    rounds no longer keeps it from starting."""
    topic = Topic("start_ceiling")
    topic.publish_many([{"seq": seq} for seq in range(3)])
    ceiling = broker.newest_message_id()
    topic.publish_many([{"seq": seq} for seq in range(3, 6)])  # after the start's look
    assert broker.sequence("start_ceiling", batch=2, up_to_id=ceiling) == 4
    assert not broker.has_unsequenced("start_ceiling", up_to_id=ceiling)
    assert broker.has_unsequenced("start_ceiling")
    assert broker.sequence("start_ceiling", batch=2) == 2
