"""Which rate keys count as due: only keys with a throttled message this worker may claim.

A key whose messages are all done keeps its row (and its old ``next_at``) for an hour;
such idle keys must not fill the throttled claim's list of due keys, or a new key's
message waits unclaimed while the park, which asks about throttled messages, reports it
due at every turn (a worker spinning with no pause). A busy worker is likewise not told
that a key is due when the only message there is one it leaves to an idle worker."""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection
from django.utils import timezone

from django_mysqlq import broker
from django_mysqlq.broker import park, rates
from django_mysqlq.models import Message, RateLimit, rate_id
from tests.conftest import wait_for
from tests.plan_support import access
from tests.testapp import rated_tasks
from tests.testapp.models import GateRun

pytestmark = pytest.mark.django_db(transaction=True)

#: More idle keys than the claim's list of due keys holds (4 per wanted message).
IDLE_KEYS = 45


def idle_keys(count: int = IDLE_KEYS) -> None:
    """Rows of keys whose messages all ran long ago (retention keeps them for an hour)."""
    old = timezone.now() - timezone.timedelta(minutes=30)
    RateLimit.objects.bulk_create([
        RateLimit(id=rate_id("default", f"idle-{n}"), queue="default", rate_key=f"idle-{n}",
                  rate_limit="10/s", next_at=old, changed_at=old) for n in range(count)])


def claimed(limit: int, *, idle: bool = True) -> list[int]:
    return [m.id for m in broker.claim_throttled(["default"], limit, "w", 30, idle=idle)]


@pytest.mark.parametrize("limit", [1, 10])
def test_idle_keys_do_not_crowd_out_a_new_keys_message(limit):
    idle_keys()
    handle = rated_tasks.per_account.enqueue("new-key", 1, "crowd")
    assert broker.idle_wait(["default"], 5.0, rates=True)[0] == "due"
    # What the park calls due, the claim takes: in its first round.
    assert claimed(limit) == [handle.id]
    # Nothing throttled is left: the park sleeps (no 'due' for keys without messages).
    started = time.monotonic()
    assert broker.idle_wait(["default"], 0.5, rates=True)[0] == "slept"
    assert time.monotonic() - started >= 0.45


def test_a_busy_worker_is_not_told_that_a_message_it_leaves_alone_is_due():
    lost = rated_tasks.per_minute.enqueue(1, "lost").id
    Message.objects.filter(pk=lost).update(losses=1)
    # Keys with only such messages don't crowd out the others either.
    idle_keys()
    for n in range(IDLE_KEYS):
        rated_tasks.per_account.enqueue(f"idle-{n}", 1, "lost")
    Message.objects.filter(rate_key__startswith="idle-").update(losses=1)
    fresh = rated_tasks.per_account.enqueue("fresh", 1, "lost").id
    assert claimed(1, idle=False) == [fresh]
    # Only messages lost before are left: a busy worker can claim none of them, so it
    # must not be told a key is due (it would go round its loop with no pause) ...
    assert claimed(5, idle=False) == []
    assert broker.seconds_to_next_start(["default"], idle=False) is None
    # ... while an idle worker is, and takes one.
    soonest = broker.seconds_to_next_start(["default"])
    assert soonest is not None and soonest <= 0
    assert len(claimed(1)) == 1


def rate_reads(queues: list[str]) -> dict[str, tuple[str, list[object]]]:
    """The statements that ask which keys are due, with their parameters."""
    marks = ", ".join(["%s"] * len(queues))
    captured: list[tuple[str, list[object]]] = []

    def spy(cursor: object, sql: str, params: list[object]) -> tuple[str, str]:
        captured.append((sql, params))
        return "slept", ""

    real = park._park
    park._park = spy  # type: ignore[assignment]
    try:
        broker.idle_wait(queues, 0.1, rates=True)
    finally:
        park._park = real  # type: ignore[assignment]
    return {"due keys": (rates.DUE_KEYS_SQL.format(queues=marks), [*queues, False, 40]),
            "next start": (rates.NEXT_START_SQL.format(queues=marks), [*queues, False]),
            "park": captured[0]}


@pytest.mark.parametrize("queues", [["default"], ["default", "other"]])
def test_the_due_checks_dive_into_each_keys_messages_by_index(queues):
    """Each key's messages are found through ``mysqlq_msg_rate``: never a scan of the
    messages table (an EXISTS was made a semi-join that materialized them all)."""
    idle_keys(300)
    rated_tasks.per_account.enqueue_many([(f"k{n % 50}", n, "plan") for n in range(500)])
    rated_tasks.unlimited.enqueue_many([(n, "plan") for n in range(1000)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE mysqlq_rate, mysqlq_message")
    for name, (sql, params) in rate_reads(queues).items():
        found = access(sql, params)
        assert ("m", "mysqlq_msg_rate", "ref") in found, (name, found)
        assert next(t for t in found if t[0] == "r")[1] == "mysqlq_rate_due", (name, found)
        assert not [t for t in found if (t[2] == "ALL" and t[0] != "mysqlq_schedule")
                    or t[0].startswith("<subquery")], (name, found)


@pytest.mark.worker
def test_a_worker_runs_a_new_keys_message_behind_many_idle_keys(start_worker):
    idle_keys()
    rated_tasks.per_account.enqueue("new-key", 1, "crowd-worker")
    worker = start_worker("--concurrency", "2", "--batch", "2")
    wait_for(lambda: GateRun.objects.filter(label="crowd-worker").exists(), timeout=60,
             message="the new key's message to run")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
