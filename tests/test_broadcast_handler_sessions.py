"""What a broadcast handler does to its thread's connections stays with it, as a task's does:
a transaction it leaves open is rolled back, a connection it leaves broken is closed, and it
runs at the site's isolation level, not the broker's READ COMMITTED. (The reader runs
in-process here, on the test's connection, as in tests/test_broadcast_reader.py.)"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction

from django_mysqlq import Topic
from django_mysqlq.topics import Subscription, TopicEvent
from django_mysqlq.worker.topics import BroadcastReader
from tests.conftest import raw_connection
from tests.thread_support import in_thread_with_default

pytestmark = pytest.mark.django_db(transaction=True)


def reader_for(topic: str, handler: Callable[[TopicEvent], Any],
               stop: threading.Event | None = None) -> BroadcastReader:
    reader = BroadcastReader([Subscription(topic, handler, None)],
                             stop or threading.Event(), poll=0.05)
    reader.begin()
    return reader


def publish_elsewhere(topic: str, value: object) -> None:
    """Publish from a thread of its own (its own connection, committed at once)."""
    def run() -> None:
        try:
            Topic(topic).publish(value)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def committed_offsets(topic: str) -> list[object]:
    """The offsets as another session sees them (committed ones only)."""
    conn = raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT msg_offset FROM mysqlq_topic_message WHERE topic = %s "
                       "ORDER BY id", [topic])
        return [row[0] for row in cursor.fetchall()]
    finally:
        conn.close()


def topic_row_free(topic: str) -> bool:
    """Whether another session may lock the topic's row at once."""
    conn = raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute("START TRANSACTION")
        try:
            cursor.execute("SELECT name FROM mysqlq_topic WHERE name = %s FOR UPDATE NOWAIT",
                           [topic])
        except Exception:  # noqa: BLE001 - 1205/3572: held
            return False
        return True
    finally:
        conn.rollback()
        conn.close()


@pytest.mark.parametrize("leave_open", ["autocommit off", "atomic entered"])
def test_a_transaction_a_handler_leaves_open_is_rolled_back_and_the_topic_goes_on(
        caplog, leave_open: str) -> None:
    """A handler returning with autocommit off (or inside an atomic() it entered by hand)
    left the reader's next poll inside that transaction: its locking read of the topic's
    row and its offset stamps stayed uncommitted for the life of the process, and no
    other reader or member could give the topic an offset again. Now the transaction is
    rolled back after the handler (its writes with it) and logged, as after a task."""
    got: list[object] = []
    entered: list[Any] = []

    def leaves_open(event: TopicEvent) -> None:
        got.append(event.payload)
        if event.payload == "first":
            if leave_open == "autocommit off":
                transaction.set_autocommit(False)
            else:
                block = transaction.atomic()
                block.__enter__()
                entered.append(block)
            with connection.cursor() as cursor:  # a write of its own, never committed
                cursor.execute("UPDATE mysqlq_topic SET sequenced_at = sequenced_at "
                               "WHERE name = 'leaky'")

    reader = reader_for("leaky", leaves_open)
    try:
        Topic("leaky").publish("first")
        with caplog.at_level(logging.ERROR, "django_mysqlq"):
            assert reader.read_once() == 1
        publish_elsewhere("leaky", "second")
        assert reader.read_once() == 1
        assert got == ["first", "second"]
        assert committed_offsets("leaky") == [1, 2]
        assert topic_row_free("leaky")
        [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert line.startswith("Broadcast handler ") and "leaves_open" in line
        assert "leaky@1 with a transaction still open on database(s) default" in line
    finally:
        stale = connections["default"]  # (without the fix: end what the handler left)
        if stale.in_atomic_block or not stale.autocommit:
            stale.close()
            del connections["default"]


@pytest.fixture(scope="module")
def side_alias(django_db_setup: None) -> Iterator[None]:
    """An alias 'side' on the tests' database (another database to the reader), made
    before the test's database access is set up, so the test may declare it."""
    connections.settings["side"] = {**connections["default"].settings_dict}
    yield
    connections["side"].close()
    del connections["side"]
    del connections.settings["side"]


@pytest.mark.usefixtures("side_alias")
@pytest.mark.django_db(transaction=True, databases=["default", "side"])
def test_a_connection_a_handler_broke_on_another_database_is_dropped() -> None:
    """The topics' database is 'default' and the handler uses another alias ('side', the
    same server here). Its session killed between two messages: the handler's next query
    fails, and before, every later one failed too ("server has gone away") until the
    process restarted: only the reader's own alias was ever closed when broken. Now the
    broken connection is closed after the handler, and the next call reconnects."""
    seen: list[object] = []

    def uses_side(event: TopicEvent) -> None:
        try:
            with connections["side"].cursor() as cursor:
                cursor.execute("SELECT CONNECTION_ID()")
                seen.append(int(cursor.fetchone()[0]))
        except DatabaseError:
            seen.append("failed")
            raise

    reader = reader_for("sided", uses_side)
    Topic("sided").publish(1)
    assert reader.read_once() == 1
    [session] = seen
    killer = raw_connection()
    try:
        killer.cursor().execute(f"KILL {int(session)}")
    finally:
        killer.close()
    Topic("sided").publish_many([2, 3])
    assert reader.read_once() == 2
    assert seen[1] == "failed"
    assert isinstance(seen[2], int) and seen[2] != session


def test_broadcast_handlers_run_at_the_site_s_isolation_level() -> None:
    """The reader's thread made its session the broker's (READ COMMITTED), so a site at
    REPEATABLE READ ran its broadcast handlers at READ COMMITTED while its tasks and
    group handlers kept its level. Now they see the site's level; the reader's own
    transactions (its sequencing) set READ COMMITTED for themselves, as the broker's do on
    a task's connection (isolation.transaction_prelude)."""
    def run() -> list[str]:
        stop = threading.Event()
        levels: list[str] = []

        def level(event: TopicEvent) -> None:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT @@tx_isolation")
                levels.append(str(cursor.fetchone()[0]))
            stop.set()

        reader = reader_for("levelled", level, stop)
        Topic("levelled").publish("x")
        reader.run()  # (as the worker's thread does; the handler stops it)
        return levels

    levels = in_thread_with_default(run, options={"isolation_level": "repeatable read"})
    assert levels == ["REPEATABLE-READ"]
    assert committed_offsets("levelled") == [1]
