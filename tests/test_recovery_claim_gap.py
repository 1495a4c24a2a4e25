"""A worker whose code has rate-limited tasks claims in two steps: the plain claim, then
the throttled one (``broker.claim_throttled``). When the second step failed after the
first had committed (a producer's late wake-up, KILL QUERY, cutting its statement short;
a dropped connection), the batch of the first was never handed to the task threads: it
never started, its lease was never renewed, and recovery took it back from a live worker
(a chaos run's 'unexplained claim losses').

Here a real worker process claims a plain message while the rate keys' table is locked,
so its throttled claim waits on the lock right after the plain claim committed; the test
then cuts that statement short (KILL QUERY) or kills the connection under it (KILL
CONNECTION). The message must run here, once, without ever counting as lost.
"""

from __future__ import annotations

import time

import MySQLdb
import pytest

from django_mysqlq.broker.park import RATE_TABLE
from django_mysqlq.models import Attempt, Message, MessageStatus, Outcome
from tests.conftest import raw_connection, wait_for
from tests.testapp import rated_tasks
from tests.testapp.models import GateRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

#: Long next to the test: before the fix the message's lease (not a sweep) took it back.
LEASE = "30"


def _waiting_on_lock(raw: MySQLdb.Connection) -> list[int]:
    """Connections (the worker's) whose statement on the rate keys waits on the lock."""
    with raw.cursor() as cursor:
        cursor.execute("SELECT id FROM information_schema.PROCESSLIST WHERE id <> CONNECTION_ID()"
                       " AND INFO LIKE %s AND STATE LIKE %s",
                       [f"%{RATE_TABLE}%", "%metadata lock%"])
        return [int(row[0]) for row in cursor.fetchall()]


def _throttled_claim_waiting(raw: MySQLdb.Connection, message_id: int) -> int | None:
    """The connection id of the worker's throttled claim waiting on the lock right after
    it claimed ``message_id`` (same connection: statements run one after another)."""
    owner = Message.objects.filter(id=message_id, status=MessageStatus.CLAIMED) \
        .values_list("owner_connection", flat=True).first()
    if owner is None:
        return None
    with raw.cursor() as cursor:
        cursor.execute("SELECT id FROM information_schema.PROCESSLIST WHERE id = %s"
                       " AND INFO LIKE %s", [owner, f"%rate_key FROM {RATE_TABLE} %"])
        row = cursor.fetchone()
    return int(row[0]) if row else None


@pytest.mark.parametrize("kill", ["QUERY", "CONNECTION"])
def test_a_batch_claimed_before_the_throttled_claim_fails_still_runs(start_worker, kill):
    label = f"claim-gap-{kill.lower()}"
    worker = start_worker("--queues", "default", "--concurrency", "2", "--batch", "4",
                          env={"MYSQLQ_TEST_LEASE": LEASE})
    wait_for(lambda: "started: queues=" in worker.output(), timeout=30,
             message="the worker to start")
    # A first message run means the worker's loop is past its first upkeep (the recovery
    # leader's retention reads the rate keys too, and waits on the lock the same way);
    # the next is a lease (30 s) away.
    warm = rated_tasks.unlimited.enqueue(0, f"{label}-warm").id
    wait_for(lambda: not Message.objects.filter(id=warm).exists(), timeout=30,
             message="the worker to run a first message")
    raw = raw_connection()
    try:
        with raw.cursor() as cursor:
            # Every worker statement reading the rate keys now waits on this lock.
            cursor.execute(f"LOCK TABLES {RATE_TABLE} WRITE")
        message_id = rated_tasks.unlimited.enqueue(1, label).id
        # A throttled claim (or a park) that began before the message was ready waits on
        # the lock too: cut short, until the one right after the message's claim waits.
        blocked = None
        deadline = time.monotonic() + 20
        while blocked is None and time.monotonic() < deadline:
            blocked = _throttled_claim_waiting(raw, message_id)
            if blocked is None and not Message.objects.filter(
                    id=message_id, status=MessageStatus.CLAIMED).exists():
                for thread_id in _waiting_on_lock(raw):
                    with raw.cursor() as cursor:
                        cursor.execute("KILL QUERY %s", [thread_id])
            time.sleep(0.05)
        assert blocked is not None, "the worker's throttled claim never waited on the lock"
        with raw.cursor() as cursor:
            cursor.execute(f"KILL {kill} %s", [blocked])
            cursor.execute("UNLOCK TABLES")
    finally:
        raw.close()

    # Well inside the 30 s lease: before the fix the message stayed claimed, unstarted and
    # unrenewed until its lease ran out (KILL QUERY), or was recovered as lost with the
    # killed connection and counted a loss (KILL CONNECTION).
    wait_for(lambda: not Message.objects.filter(id=message_id).exists(), timeout=15,
             message="the claimed message to run")
    assert GateRun.objects.filter(label=label, edge="start").count() == 1
    assert list(Attempt.objects.filter(message_id=message_id)
                .values_list("attempt", "outcome")) == [(1, Outcome.SUCCEEDED)]
    # Run on its first claim: never taken back as a vanished worker's (nor a loss counted).
    assert "vanished workers" not in worker.output()
