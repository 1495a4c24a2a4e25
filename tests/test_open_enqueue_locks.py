"""A producer's open transaction holds up no claim: the headline pattern must not stall.

``with transaction.atomic(): task.enqueue(...); <more work>`` keeps the new row locked,
uncommitted, until the commit. The claim's ``UPDATE … FORCE INDEX (mysqlq_msg_claim) …
LIMIT`` scans a secondary index, where InnoDB's semi-consistent read doesn't apply: it
waited 1 s on that row (then 1205), holding the worker's control thread, and so every
queue it serves, and then warned the operator to go and find a stranger's transaction.
On MariaDB the fast statements now wait for no row lock (a few milliseconds' retries for
another claim's rows), step around at once, and say so at INFO; a WARNING comes only when
the lock lasts.

Timings below are behavioural bounds with wide margins (the old wait was 1 s), never
benchmarks.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction

from django_mysqlq import broker
from django_mysqlq.broker import locked
from django_mysqlq.models import Message
from django_mysqlq.worker.upkeep import Housekeeping
from tests.conftest import raw_connection, wait_for
from tests.test_locked_and_bad_rows import RowLock
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

#: Well under the 1 s the fast path used to wait on the producer's row.
NO_STALL = 0.5


class OpenEnqueue:
    """A producer's ``transaction.atomic()`` that enqueued and stays open (another thread,
    its own connection) until the block ends, then commits."""

    def __init__(self, enqueue: Any) -> None:
        self.enqueue = enqueue
        self.id: int | None = None
        self._held = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            with transaction.atomic():
                self.id = self.enqueue().id
                self._held.set()
                self._release.wait(60)
        finally:
            self._held.set()
            connections.close_all()

    def __enter__(self) -> OpenEnqueue:
        self._thread.start()
        assert self._held.wait(10) and self.id is not None
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join(30)


@pytest.fixture(autouse=True)
def _forget_locked_queues() -> Iterator[None]:
    locked.LOCKED_ROWS.forget()
    yield
    locked.LOCKED_ROWS.forget()


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == level and r.name == "django_mysqlq"]


def test_a_claim_steps_around_a_producers_uncommitted_enqueue_at_once(monkeypatch, caplog):
    monkeypatch.setattr(locked, "AROUND_LOOK_AGAIN_SECONDS", 0.2)
    before = tasks.record.enqueue("before").id
    with OpenEnqueue(lambda: tasks.record.enqueue("uncommitted")) as producer:
        after = tasks.record.enqueue("after").id
        other = tasks.on_other_queue.enqueue("other").id
        with caplog.at_level(logging.INFO, logger="django_mysqlq"):
            started = time.monotonic()
            claimed = broker.claim(["default", "other"], 10, "w", lease_seconds=30)
            took = time.monotonic() - started
        assert took < NO_STALL, took
        assert sorted(m.id for m in claimed) == sorted([before, after, other])
        assert locked.LOCKED_ROWS.around(("default", "default"))
        assert not locked.LOCKED_ROWS.around(("default", "other"))
        assert not [r for r in caplog.records if r.name == "django_mysqlq"]  # a first look
        # Still open when the fast path looks again: no committed row is held (the row in
        # the way is the producer's, invisible to everyone until it commits), so nothing is
        # said or counted, and the claim goes on stepping around it.
        time.sleep(0.3)
        waits = broker.stats.lock_waits
        with caplog.at_level(logging.INFO, logger="django_mysqlq"):
            assert broker.claim(["default", "other"], 10, "w", lease_seconds=30) == []
        assert not [r for r in caplog.records if r.name == "django_mysqlq"]
        assert broker.stats.lock_waits == waits
        assert locked.LOCKED_ROWS.around(("default", "default"))
    # Committed: claimed like any other (still by the SKIP LOCKED path while it lasts).
    [message] = broker.claim(["default", "other"], 10, "w", lease_seconds=30)
    assert message.id == producer.id


def test_a_lock_gone_by_the_second_look_is_neither_said_nor_counted(monkeypatch, caplog):
    """A producer's transaction that commits a moment later: nothing to tell anyone."""
    monkeypatch.setattr(locked, "AROUND_LOOK_AGAIN_SECONDS", 0.2)
    before = broker.stats.lock_waits
    with caplog.at_level(logging.INFO, logger="django_mysqlq"):
        with OpenEnqueue(lambda: tasks.record.enqueue("uncommitted")) as producer:
            assert broker.claim(["default"], 10, "w", lease_seconds=30) == []
        time.sleep(0.3)
        [message] = broker.claim(["default"], 10, "w", lease_seconds=30)
    assert message.id == producer.id
    assert not locked.LOCKED_ROWS.around(("default", "default"))
    assert not [r for r in caplog.records if r.name == "django_mysqlq"]
    assert broker.stats.lock_waits == before


def test_promotion_steps_around_a_producers_uncommitted_due_message_at_once(monkeypatch,
                                                                            caplog):
    """A delayed message whose time came while its producer's transaction stayed open is
    in the promotion's way as a ready one is in the claim's."""
    monkeypatch.setattr(locked, "AROUND_LOOK_AGAIN_SECONDS", 0.2)
    due = [h.id for h in tasks.record.using(delay=0.2).enqueue_many([["a"], ["b"]])]
    with OpenEnqueue(lambda: tasks.record.using(delay=0.2).enqueue("uncommitted")) as producer:
        time.sleep(0.5)  # all three are due now
        with caplog.at_level(logging.INFO, logger="django_mysqlq"):
            started = time.monotonic()
            assert broker.promote_due() == 2
            took = time.monotonic() - started
            assert took < NO_STALL, took
            time.sleep(0.3)
            assert broker.promote_due() == 0  # the fast path looks again: still there
        assert set(Message.objects.filter(status="ready").values_list("id", flat=True)) == \
            set(due)
        assert not _records(caplog, logging.WARNING)
        assert any(m.startswith("Promotion of due messages: a row is locked by another "
                                "transaction, most likely a producer's")
                   for m in _records(caplog, logging.INFO))
    assert broker.promote_due() == 1
    assert Message.objects.get(pk=producer.id).status == "ready"


def test_a_lock_that_lasts_is_warned_of_once(monkeypatch, caplog):
    """A stranger's ``SELECT … FOR UPDATE`` on a ready row, held while the fast path meets
    it at every try (pauses made small here: a look after 0.05 s, then 0.1 s, 0.2 s, and
    0.4 s warns)."""
    monkeypatch.setattr(locked, "AROUND_LOOK_AGAIN_SECONDS", 0.05)
    monkeypatch.setattr(locked, "AROUND_FIRST_SECONDS", 0.1)
    monkeypatch.setattr(locked, "AROUND_WARNING_SECONDS", 0.4)
    ids = [h.id for h in tasks.record.enqueue_many([["held"], ["free"]])]
    claimed: list[int] = []
    with caplog.at_level(logging.INFO, logger="django_mysqlq"), RowLock(ids[:1]):
        deadline = time.monotonic() + 10
        while not _records(caplog, logging.WARNING) and time.monotonic() < deadline:
            claimed += [m.id for m in broker.claim(["default"], 10, "w", lease_seconds=30)]
            time.sleep(0.05)
        # A few more tries while it lasts: still one warning.
        for _ in range(10):
            claimed += [m.id for m in broker.claim(["default"], 10, "w", lease_seconds=30)]
            time.sleep(0.05)
    assert claimed == ids[1:]
    [first] = [m for m in _records(caplog, logging.INFO) if "locked by another" in m]
    assert "a ready message (a SELECT … FOR UPDATE" in first
    assert "producer" not in first
    [warning] = _records(caplog, logging.WARNING)
    assert warning.startswith("Queue 'default': the fast path has met a locked row at "
                              "every try for "), warning
    assert "information_schema.INNODB_TRX" in warning
    assert "SELECT … FOR UPDATE left open" in warning
    locked.LOCKED_ROWS.forget()  # (the next try of the fast path, now)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="django_mysqlq"):
        [message] = broker.claim(["default"], 10, "w", lease_seconds=30)
    assert message.id == ids[0]


def test_the_episode_ends_with_the_lock(monkeypatch, caplog):
    monkeypatch.setattr(locked, "AROUND_LOOK_AGAIN_SECONDS", 0.05)
    monkeypatch.setattr(locked, "AROUND_FIRST_SECONDS", 0.1)
    first = tasks.record.enqueue("held").id
    with caplog.at_level(logging.INFO, logger="django_mysqlq"):
        with RowLock([first]):
            assert broker.claim(["default"], 10, "w", lease_seconds=30) == []
            time.sleep(0.1)
            assert broker.claim(["default"], 10, "w", lease_seconds=30) == []  # said
        time.sleep(0.15)  # the pause is over: the fast path is tried again, and goes through
        [message] = broker.claim(["default"], 10, "w", lease_seconds=30)
    assert message.id == first
    assert "default: no locked row in the way any more; back to the fast path." in \
        _records(caplog, logging.INFO)
    assert not locked.LOCKED_ROWS.around(("default", "default"))


def test_a_row_held_for_a_moment_is_waited_for_not_stepped_around(monkeypatch, caplog):
    """Another worker's claim holds the rows it takes for the milliseconds of its
    statement: met with no wait at all, the fast path tries again after a brief pause
    (made long here, so the row is free by then) instead of starting an episode."""
    monkeypatch.setattr(locked, "BRIEF_LOCK_PAUSES", (0.4,))
    ids = [h.id for h in tasks.record.enqueue_many([["a"], ["b"]])]
    with RowLock(ids[:1]) as lock:
        threading.Timer(0.05, lock.__exit__).start()  # released before the pause is over
        with caplog.at_level(logging.INFO, logger="django_mysqlq"):
            claimed = broker.claim(["default"], 10, "w", lease_seconds=30)
    assert sorted(m.id for m in claimed) == ids
    assert not locked.LOCKED_ROWS.around(("default", "default"))
    assert not [m for m in _records(caplog, logging.INFO) if "locked" in m]


def _session_lock_wait() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@session.innodb_lock_wait_timeout")
        return int(cursor.fetchone()[0])


def test_only_the_fast_statements_wait_for_no_row_lock_on_a_connection_the_broker_owns():
    """The control connection's session keeps the short 1 s wait for its other statements
    (a recovery, a schedule's advance must not fail at once on a lock held for a moment):
    the claim's and the promotion's statements alone wait for none, each scoped to itself."""
    connection.ensure_connection()
    raw = connection.connection
    raw._django_mysqlq_read_committed = True  # as if owned
    try:
        sql = locked.no_wait(connection, "SELECT 1")
        assert sql == "SET STATEMENT innodb_lock_wait_timeout = 0 FOR SELECT 1"
        assert _session_lock_wait() == locked.LOCK_WAIT_SECONDS
        with connection.cursor() as cursor:
            cursor.execute(sql)
        assert _session_lock_wait() == locked.LOCK_WAIT_SECONDS
        assert locked.short_wait(connection, "SELECT 1") == "SELECT 1"
    finally:
        for attribute in ("_django_mysqlq_read_committed", locked.SESSION_WAIT_ATTRIBUTE):
            setattr(raw, attribute, False)
        connection.close()  # (the session's lowered wait goes with it)


def _json_lines(output: str) -> list[dict[str, Any]]:
    lines = []
    for line in output.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


@pytest.mark.worker
def test_a_worker_keeps_serving_its_other_queue_while_a_producer_holds_an_enqueue(
        start_worker):
    """Tasks trickle into one queue every 0.1 s while a producer keeps an enqueue into the
    worker's other queue uncommitted for 3 s: they keep starting with no gap near the old
    1 s lock wait (the claim of the other queue used to stall them all), and nothing is
    said of the lock (no committed row was held: the producer's insert is no one's yet)."""
    # (Its own JSON handler, levels included: not the suite's LOGGING.)
    worker = start_worker("--queues", "default,other", "--concurrency", "2",
                          "--log-format", "json",
                          env={"MYSQLQ_TEST_LOGGING": "django-default"})
    wait_for(lambda: " started: " in worker.output(), message="the worker to start")
    stop = threading.Event()
    count = itertools.count()

    def trickle() -> None:
        try:
            while not stop.is_set():
                tasks.record.enqueue(f"t{next(count)}")
                time.sleep(0.1)
        finally:
            connections.close_all()

    feeder = threading.Thread(target=trickle)
    feeder.start()
    try:
        time.sleep(1.0)
        held_from = time.time()
        with OpenEnqueue(lambda: tasks.on_other_queue.enqueue("held")):
            time.sleep(3.0)
        held_to = time.time()
        time.sleep(1.0)
    finally:
        stop.set()
        feeder.join(30)
    wait_for(lambda: Ledger.objects.filter(label="held").exists(), timeout=20,
             message="the held message to run once committed")
    sent = next(count)
    wait_for(lambda: Ledger.objects.filter(label__startswith="t").count() == sent,
             timeout=20, message="the trickled tasks to run")
    starts = [row.timestamp() for row in Ledger.objects.filter(label__startswith="t")
              .order_by("created_at").values_list("created_at", flat=True)]
    during = [t for t in starts if held_from - 0.5 <= t <= held_to + 0.5]
    assert len(during) >= 15, len(during)
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert max(gaps) < 0.75, sorted(gaps)[-5:]
    lines = _json_lines(worker.output())
    assert lines, worker.output()
    warnings = [line["message"] for line in lines if line["level"] in ("WARNING", "ERROR")]
    assert not warnings, warnings
    # The row in the way was the producer's, uncommitted: stepped around in silence.
    assert not any("locked by another transaction" in line["message"] for line in lines), \
        worker.output()


def test_an_episode_the_fast_path_never_came_back_to_is_not_carried_on() -> None:
    """A locked row met, then the queue's fast path not run for long (paused, no room):
    the next meeting carried the old episode on (counted at once, and warned of as a lock
    of an hour at the next look). It starts a new one now: a silent look first."""
    rows = locked.LockedRows()
    key = ("default", "default")
    assert rows.found(key, waited=False)[0] == locked.LOOK
    assert rows.found(key, waited=False)[0] == locked.FIRST
    rows._until[key] -= 3600  # (as if an hour had passed since)
    rows._since[key] -= 3600
    kind, pause, lasted = rows.found(key, waited=False)
    assert (kind, pause, lasted) == (locked.LOOK, locked.AROUND_LOOK_AGAIN_SECONDS, 0.0)


# ------------------------------------------------------------------ a table's lock


@pytest.fixture
def table_locked() -> Iterator[None]:
    """A stranger's ``LOCK TABLES mysqlq_message WRITE`` (as an ALTER TABLE waiting for its
    turn would): any statement on the table waits ``lock_wait_timeout`` for its metadata
    lock, then fails with 1205, the error a row's lock gives."""
    stranger = raw_connection()
    try:
        stranger.cursor().execute("LOCK TABLES mysqlq_message WRITE")
        yield
    finally:
        stranger.close()  # (its LOCK TABLES ends with it)


def test_a_tables_lock_is_not_taken_for_a_rows_by_the_promotion(table_locked, caplog):
    """The promotion of due messages waits once for the table, its bounded wait, and is
    skipped for the round. The fast path took the 1205 for a row's lock (met at once, as
    it waits for none): it waited again after each brief pause and then stepped around,
    waiting once more, five times the bound in all, every round."""
    housekeeping = Housekeeping("w1", 1)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="django_mysqlq"):
        housekeeping.promotion_round()
    took = time.monotonic() - started
    assert 1 <= took < 2.5, took
    assert _records(caplog, logging.WARNING) == [
        "Worker w1: upkeep step 'promotion of due messages' skipped: mysqlq_message is "
        "locked by another session (lock wait timeout 1 s); retrying next round."]
    assert not [m for m in _records(caplog, logging.INFO) if "row is locked" in m]
    assert not locked.LOCKED_ROWS.around(("default", "promotion of due messages"))


def test_a_tables_lock_is_not_taken_for_a_rows_by_the_claim(table_locked, caplog):
    """A server whose ``lock_wait_timeout`` is short (1 s here): the claim waits once and
    raises, saying it was the table's lock; no locked-row episode, nothing said of a
    producer's row. It waited four times (the fast path), then eight more (the step
    around, retried as any lock wait)."""
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION lock_wait_timeout = 1")
    try:
        started = time.monotonic()
        with pytest.raises(OperationalError) as raised, \
                caplog.at_level(logging.INFO, logger="django_mysqlq"):
            broker.claim(["default", "other"], 10, "w", lease_seconds=30)
        took = time.monotonic() - started
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION lock_wait_timeout = DEFAULT")
    assert 1 <= took < 2.5, took
    assert broker.is_lock_wait(raised.value)
    assert "waiting for the table's metadata lock" in str(raised.value)
    assert not [r for r in caplog.records if r.name == "django_mysqlq"]
    assert not locked.LOCKED_ROWS.around(("default", "default"))
