"""A stranger's lock on a housekeeping table must not stall a worker's control loop.

``LOCK TABLES mysqlq_rate WRITE`` (or a long ALTER: any metadata lock) made the recovery
leader's retention and repairs wait ``lock_wait_timeout`` (a day), and a row locked in an
open transaction made retention wait and retry for good: meanwhile that worker claimed
nothing and, being the recovery leader, recovered nobody's messages. Its throttled claim
waited on the rate keys' table the same way right after the plain claim. Now each step
waits at most ``MYSQLQ['UPKEEP_LOCK_WAIT_SECONDS']`` and is skipped for the round.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import MySQLdb
import pytest
from django.db import OperationalError, connection

from django_mysqlq import broker
from django_mysqlq.broker.park import RATE_TABLE
from django_mysqlq.models import Message, Worker
from django_mysqlq.worker.upkeep import Housekeeping
from tests.conftest import raw_connection, wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True)]

#: Short leases: the leader's housekeeping round comes every LEASE seconds.
LEASE = "4"
WAITS_SQL = "SELECT @@session.lock_wait_timeout, @@session.innodb_lock_wait_timeout"


@pytest.fixture
def stranger() -> Iterator[MySQLdb.Connection]:
    conn = raw_connection()
    try:
        yield conn
    finally:
        conn.close()  # (ends its LOCK TABLES or its transaction, whatever the test did)


def _session_waits() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(WAITS_SQL)
        metadata, rows = cursor.fetchone()
    return int(metadata), int(rows)


def _set_session_waits(metadata: int, rows: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION lock_wait_timeout = %s, innodb_lock_wait_timeout = %s",
                       [metadata, rows])


def _old_stopped_worker(worker_id: str) -> None:
    """A stopped worker's row old enough for retention (7 days by default) to delete."""
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=8)
    Worker.objects.create(id=worker_id, host="gone", pid=1, queues="default", concurrency=1,
                          started_at=old, last_heartbeat=old, stopped_at=old)


# ------------------------------------------------------------------ in this process


def test_a_step_on_a_locked_table_gives_up_once_and_the_session_waits_are_restored(
        stranger, caplog):
    _set_session_waits(77, 33)  # the session's own values, not the server's defaults
    with stranger.cursor() as cursor:
        cursor.execute(f"LOCK TABLES {RATE_TABLE} WRITE")
    housekeeping = Housekeeping("w1", 1)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        housekeeping.leader_round("h", 1, 30.0)
    elapsed = time.monotonic() - started
    # One wait of 1 s for the table (not 8 retries, nor a day); the repair on the same
    # table is skipped at once in the same round.
    assert elapsed < 4, elapsed
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert skipped == [
        "Worker w1: upkeep step 'rate key retention' skipped: mysqlq_rate is locked by "
        "another session (lock wait timeout 1 s); retrying next round.",
        "Worker w1: upkeep step 'rate key repair' skipped: mysqlq_rate is locked by "
        "another session (lock wait timeout 1 s); retrying next round.",
    ]
    assert _session_waits() == (77, 33)
    with stranger.cursor() as cursor:
        cursor.execute("UNLOCK TABLES")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        housekeeping.leader_round("h", 1, 30.0)  # the next round goes through
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]
    assert _session_waits() == (77, 33)


def test_the_session_waits_are_restored_when_the_block_raises(stranger):
    before = _session_waits()
    with stranger.cursor() as cursor:
        cursor.execute(f"LOCK TABLES {RATE_TABLE} WRITE")
    started = time.monotonic()
    with pytest.raises(OperationalError) as raised, broker.bounded_lock_waits(1):
        assert _session_waits() == (1, 1)
        broker.repair_rate_keys()
    assert broker.is_lock_wait(raised.value)
    assert time.monotonic() - started < 4  # not retried by with_lock_retry
    assert _session_waits() == before
    with pytest.raises(ValueError), broker.bounded_lock_waits(1):
        raise ValueError("not the database's")
    assert _session_waits() == before


def test_a_short_row_lock_wait_first_set_inside_the_block_is_kept():
    """A broker-owned session keeps ``locked.short_wait``'s 1 s row-lock wait for good:
    set inside the block, it is not undone by the restore (nor set again every round)."""
    from django_mysqlq.broker.locked import SESSION_WAIT_ATTRIBUTE, short_wait

    _set_session_waits(77, 33)
    raw = None
    try:
        with broker.bounded_lock_waits(2):
            raw = connection.connection
            raw._django_mysqlq_read_committed = True  # as if owned
            short_wait(connection, "SELECT 1")
        assert _session_waits() == (77, 1)
        assert getattr(raw, SESSION_WAIT_ATTRIBUTE)
    finally:
        for attribute in ("_django_mysqlq_read_committed", SESSION_WAIT_ATTRIBUTE):
            if raw is not None:
                setattr(raw, attribute, False)  # (the driver's objects refuse delattr)


def test_a_row_locked_by_an_open_transaction_skips_its_step(stranger, caplog):
    _old_stopped_worker("gone:1:row-locked")
    _set_session_waits(40, 50)
    with stranger.cursor() as cursor:
        cursor.execute("START TRANSACTION")
        cursor.execute("SELECT id FROM mysqlq_worker WHERE id = %s FOR UPDATE",
                       ["gone:1:row-locked"])
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        Housekeeping("w2", 1).leader_round("h", 1, 30.0)
    assert time.monotonic() - started < 4
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    # (Marking stale workers may walk onto the row too: then retention, on the same table,
    # is skipped without a second wait.) One line per step, each naming the table.
    assert ("Worker w2: upkeep step 'worker row retention' skipped: mysqlq_worker is locked "
            "by another session (lock wait timeout 1 s); retrying next round.") in skipped
    assert len(skipped) == len(set(skipped))
    assert all("mysqlq_worker is locked" in line for line in skipped)
    assert _session_waits() == (40, 50)
    assert Worker.objects.filter(id="gone:1:row-locked").exists()


def test_the_throttled_claim_gives_up_on_a_locked_rate_table(stranger):
    before = _session_waits()
    with stranger.cursor() as cursor:
        cursor.execute(f"LOCK TABLES {RATE_TABLE} WRITE")
    started = time.monotonic()
    with pytest.raises(OperationalError) as raised:
        broker.claim_throttled(["default"], 1, "w3", 30.0, lock_wait=1)
    assert broker.is_lock_wait(raised.value)
    assert time.monotonic() - started < 4
    assert _session_waits() == before


# ------------------------------------------------------------------ real workers


def _started(worker) -> bool:
    return "started: queues=" in worker.output()


def _runs_promptly(label: str, within: float) -> None:
    tasks.record.enqueue(label)
    wait_for(lambda: Ledger.objects.filter(label=label).exists(), timeout=within,
             message=f"{label} to run while the lock is held")


def _keeps_claiming(seconds: float, label: str) -> None:
    """Plain messages enqueued one a second keep running within a few seconds."""
    end = time.monotonic() + seconds
    index = 0
    while time.monotonic() < end:
        _runs_promptly(f"{label}-{index}", within=6)
        index += 1
        time.sleep(1)


@pytest.mark.worker
def test_a_leader_keeps_claiming_while_the_rate_table_is_locked(start_worker, stranger):
    worker = start_worker("--queues", "default", env={"MYSQLQ_TEST_LEASE": LEASE})
    wait_for(lambda: _started(worker), timeout=30, message="the worker to start")
    _runs_promptly("warm", within=30)
    with stranger.cursor() as cursor:
        cursor.execute(f"LOCK TABLES {RATE_TABLE} WRITE")
    _keeps_claiming(10, "table-locked")
    assert ("upkeep step 'rate key retention' skipped: mysqlq_rate is locked by another "
            "session") in worker.output()
    assert "retrying next round" in worker.output()
    # The throttled claim gave way too, said once for the whole lock episode, and on the
    # worker's row while it lasts (queuestats and the admin show it).
    assert worker.output().count("throttled messages are not claimed until it is free") == 1
    row = Worker.objects.filter(pid=worker.pid, stopped_at__isnull=True)
    wait_for(lambda: f"{RATE_TABLE} locked by another session since " in row.get().troubles,
             timeout=10, message="the worker's row to say the rate table is held")
    with stranger.cursor() as cursor:
        cursor.execute("UNLOCK TABLES")
    _runs_promptly("after", within=10)
    wait_for(lambda: RATE_TABLE not in row.get().troubles, timeout=15,
             message="the worker's row to drop the lock once it is gone")


@pytest.mark.worker
def test_a_leader_recovers_a_killed_peer_while_the_rate_table_is_locked(start_worker,
                                                                        stranger,
                                                                        tmp_path: Path):
    leader = start_worker("--queues", "default,other", "--concurrency", "1", "--batch", "1",
                          env={"MYSQLQ_TEST_LEASE": LEASE}, label="-leader")
    wait_for(lambda: _started(leader), timeout=30, message="the leader to start")
    _runs_promptly("warm", within=30)  # its first upkeep took the recovery lock
    peer = start_worker("--queues", "other", "--concurrency", "1", "--batch", "1",
                        env={"MYSQLQ_TEST_LEASE": LEASE}, label="-peer")
    wait_for(lambda: _started(peer), timeout=30, message="the peer to start")
    # The leader is busy (no room to claim), so the peer claims the victim. Busy until
    # the gate opens: had it ended before the peer woke, the leader could take the victim.
    gate = tmp_path / "gate"
    tasks.slow_until_opened.enqueue("busy", str(gate))
    wait_for(lambda: Ledger.objects.filter(label="busy:start").exists(), timeout=10,
             message="the leader to run its slow task")
    victim = tasks.slow_first_time.using(queue="other").enqueue("victim", 60).id
    wait_for(lambda: Ledger.objects.filter(label="victim:start", pid=peer.pid).exists(),
             timeout=10, message="the peer to start the victim")
    with stranger.cursor() as cursor:
        cursor.execute(f"LOCK TABLES {RATE_TABLE} WRITE")
    gate.touch()  # the leader's slow task ends now
    # Past a housekeeping round of the leader and the end of its slow task: before the
    # fix its loop waited on the lock by now (retention, or its throttled claim).
    time.sleep(float(LEASE) + 1)
    peer.signal(signal.SIGKILL)
    assert peer.wait(timeout=10) == -signal.SIGKILL
    # Far short of the day lock_wait_timeout made it wait, with room on a loaded machine
    # for its rounds' 2 s waits on the locked table (retention every LEASE seconds, the
    # throttled claim's retries).
    wait_for(lambda: Ledger.objects.filter(label="victim:end", pid=leader.pid).exists(),
             timeout=20, message="the leader to recover and run the victim, table locked")
    # (Acked in a batch a moment after its end.)
    wait_for(lambda: not Message.objects.filter(id=victim).exists(), timeout=5,
             message="the leader to ack the victim, table locked")
    with stranger.cursor() as cursor:
        cursor.execute("UNLOCK TABLES")
    assert "vanished workers" in leader.output()


@pytest.mark.worker
def test_a_leader_keeps_claiming_while_a_row_retention_needs_is_locked(start_worker,
                                                                      stranger):
    _old_stopped_worker("gone:1:locked-row")
    # Locked before the worker starts: its first housekeeping round would delete it.
    with stranger.cursor() as cursor:
        cursor.execute("START TRANSACTION")
        cursor.execute("SELECT id FROM mysqlq_worker WHERE id = %s FOR UPDATE",
                       ["gone:1:locked-row"])
    worker = start_worker("--queues", "default", env={"MYSQLQ_TEST_LEASE": LEASE})
    wait_for(lambda: _started(worker), timeout=30, message="the worker to start")
    _keeps_claiming(10, "row-locked")
    assert ("upkeep step 'worker row retention' skipped: mysqlq_worker is locked by another "
            "session") in worker.output()
    with stranger.cursor() as cursor:
        cursor.execute("ROLLBACK")
    # Next round the row goes.
    wait_for(lambda: not Worker.objects.filter(id="gone:1:locked-row").exists(), timeout=15,
             message="retention to delete the row once unlocked")
