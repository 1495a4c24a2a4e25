"""The claim statement: its plan, its order, and what it stamps on a message."""

from __future__ import annotations

import importlib
import json
import threading
import time

import pytest
from django.db import OperationalError, connection, connections, transaction

from django_mysqlq import broker
from django_mysqlq.broker import locked, promote
from django_mysqlq.models import CLAIM_INDEX, Message
from tests.testapp import tasks

# By path: the package re-exports a function named like this module.
claim_module = importlib.import_module("django_mysqlq.broker.claim")

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "test-worker"


def claim(queues=("default",), limit=10):
    return broker.claim(list(queues), limit, WORKER, lease_seconds=30)


def explain(sql: str, params: list) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN FORMAT=JSON " + sql, params)
        return json.loads(cursor.fetchone()[0])


def plan_problems(plan: dict) -> list[str]:
    """What is wrong with a claim plan: another index, a full scan, a filesort."""
    text = json.dumps(plan)
    problems = []
    if "filesort" in text:
        problems.append("filesort")
    table = plan["query_block"].get("buffer", plan["query_block"]).get("table", {})
    if table.get("key") != CLAIM_INDEX:
        problems.append(f"index {table.get('key')!r}")
    if table.get("access_type") != "range":
        problems.append(f"access {table.get('access_type')!r}")
    return problems


@pytest.fixture
def backlog():
    """3,000 ready messages over three priorities and two queues, statistics fresh."""
    tasks.record.enqueue_many([[f"m{i}"] for i in range(1000)])
    tasks.record.using(priority=10).enqueue_many([[f"h{i}"] for i in range(1000)])
    tasks.record.using(queue="other", priority=-5).enqueue_many([[f"o{i}"] for i in range(1000)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE mysqlq_message")
        cursor.fetchall()


def claim_params(limit=10):
    return ["token", True, 1, WORKER, 30_000_000, "default", limit]


def test_claim_walks_the_claim_index_without_a_filesort(backlog):
    assert plan_problems(explain(broker.claim_sql(), claim_params())) == []


def test_the_claim_around_locked_rows_walks_the_claim_index_too(backlog):
    select = claim_module.with_queue_collation(claim_module.READY_UNLOCKED_SQL,
                                               claim_module._queue_collation("default"))
    plan = explain(select, ["default", 10])
    [step] = plan["query_block"]["nested_loop"]
    assert step["table"]["key"] == CLAIM_INDEX
    assert step["table"]["access_type"] in ("ref", "range")
    assert "filesort" not in json.dumps(plan)
    by_id = claim_module.CLAIM_IDS_SQL.format(ids="%s, %s")
    [table] = [explain(by_id, ["t", 1, 1, WORKER, 30_000_000, 1, 2])["query_block"]["table"]]
    assert (table["key"], table["access_type"]) == ("PRIMARY", "range")


def test_the_plan_check_catches_a_claim_that_sorts(backlog):
    # Same statement with the priority direction flipped against the index: must be caught.
    flipped = broker.claim_sql().replace("priority DESC, id", "priority ASC, id")
    assert "filesort" in plan_problems(explain(flipped, claim_params()))


def test_promotion_walks_the_due_index(backlog):
    for sql in (promote.PROMOTE_SQL, promote.DUE_UNLOCKED_SQL):
        text = json.dumps(explain(sql, [100]))
        assert "mysqlq_msg_due" in text
        assert "filesort" not in text


def test_claim_takes_higher_priority_first_then_fifo():
    low = tasks.record.using(priority=-10).enqueue("low")
    first = tasks.record.enqueue("first")
    second = tasks.record.enqueue("second")
    high = tasks.record.using(priority=100).enqueue("high")
    order = [m.id for m in claim(limit=10)]
    assert order == [high.id, first.id, second.id, low.id]


def test_claim_respects_the_limit_and_the_queue_order():
    others = tasks.on_other_queue.enqueue_many([["o1"], ["o2"]])
    defaults = tasks.record.enqueue_many([["d1"], ["d2"]])
    got = claim(queues=("other", "default"), limit=3)
    assert [m.id for m in got] == [others[0].id, others[1].id, defaults[0].id]
    assert Message.objects.ready().count() == 1


def test_claim_stamps_owner_token_lease_and_attempt():
    handle = tasks.record.enqueue("x")
    [message] = claim()
    row = Message.objects.get(pk=handle.id)
    connection_id, server_start = broker.connection_identity()
    assert row.status == "claimed"
    assert row.owner_connection == connection_id == message.connection_id
    assert row.owner_server_start == server_start
    assert row.claim_token == message.claim_token and len(message.claim_token) == 32
    assert row.worker_id == WORKER
    assert row.attempts == message.attempt == 1
    assert row.lease_expires_at > row.claimed_at


def test_two_claims_by_one_connection_read_back_only_their_own_batch():
    tasks.record.enqueue_many([[f"m{i}"] for i in range(4)])
    first = claim(limit=2)
    second = claim(limit=2)
    assert len(first) == len(second) == 2
    assert {m.id for m in first}.isdisjoint({m.id for m in second})
    assert first[0].claim_token != second[0].claim_token


def test_scheduled_messages_are_not_claimed_until_promoted():
    tasks.record.using(delay=3600).enqueue("later")
    due = tasks.record.using(delay=0.05).enqueue("soon")
    assert claim() == []
    import time

    time.sleep(0.1)
    assert broker.promote_due() == 1
    assert [m.id for m in claim()] == [due.id]


def test_claim_refuses_to_run_inside_a_transaction():
    tasks.record.enqueue("x")
    with transaction.atomic(), pytest.raises(RuntimeError, match="autocommit"):
        claim()
    assert Message.objects.ready().count() == 1


def test_release_gives_a_claim_back_as_if_never_claimed():
    tasks.record.enqueue("x")
    [message] = claim()
    assert broker.release([message]) == 1
    row = Message.objects.get(pk=message.id)
    assert (row.status, row.attempts, row.claim_token, row.owner_connection) == (
        "ready", 0, None, None)


def test_renewing_leases_extends_only_this_workers_claims():
    tasks.record.enqueue_many([["a"], ["b"]])
    [mine] = claim(limit=1)
    broker.claim(["default"], 1, "someone-else", lease_seconds=30)
    before = {m.pk: m.lease_expires_at for m in Message.objects.claimed()}
    assert broker.renew_leases([(mine.id, mine.claim_token)], lease_seconds=300) == 1
    after = {m.pk: m.lease_expires_at for m in Message.objects.claimed()}
    assert after[mine.id] > before[mine.id]
    other = next(pk for pk in before if pk != mine.id)
    assert after[other] == before[other]


def test_a_lock_wait_on_claim_steps_around_the_locked_row_and_is_counted(monkeypatch):
    """The claim waits for no stranger's row lock (MariaDB; 1 s on MySQL), never InnoDB's
    50 s; a lock still there when the fast path looks again is counted."""
    monkeypatch.setattr(locked, "AROUND_LOOK_AGAIN_SECONDS", 0.1)
    handle = tasks.record.enqueue("locked")
    holding, release = threading.Event(), threading.Event()

    def hold_row_lock():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT id FROM mysqlq_message WHERE id = %s FOR UPDATE", [handle.id])
            holding.set()
            release.wait(30)
        connections.close_all()

    holder = threading.Thread(target=hold_row_lock)
    holder.start()
    locked.LOCKED_ROWS.forget()
    try:
        assert holding.wait(10)
        before = broker.stats.lock_waits
        assert claim() == []  # the only ready row is locked: stepped over, not waited for
        assert broker.stats.lock_waits == before  # (a first look: most such locks pass)
        assert locked.LOCKED_ROWS.around(("default", "default"))
        time.sleep(0.15)
        assert claim() == []  # still there when the fast path looks again
        assert broker.stats.lock_waits == before + 1
        assert locked.LOCKED_ROWS.around(("default", "default"))
    finally:
        release.set()
        holder.join()
    [message] = claim()  # free again: taken by the SKIP LOCKED path while it lasts
    assert message.id == handle.id
    locked.LOCKED_ROWS.forget()


def test_an_interrupted_read_back_gives_the_batch_back():
    tasks.record.enqueue_many([["a"], ["b"]])
    calls = []

    def failing_read(execute, sql, params, many, context):
        if sql.lstrip().startswith("SELECT id, queue, task_name"):
            calls.append(sql)
            raise OperationalError(2013, "Lost connection to server during query")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(failing_read), pytest.raises(OperationalError):
        claim()
    assert calls
    rows = list(Message.objects.values_list("status", "attempts", "claim_token"))
    assert rows == [("ready", 0, None), ("ready", 0, None)]


def test_a_worker_releases_claims_it_lost_track_of():
    tasks.record.enqueue_many([["a"], ["b"], ["c"]])
    kept = claim(limit=1)
    claim(limit=2)  # "forgotten" by the worker
    assert broker.release_strays(WORKER, keep=[kept[0].claim_token]) == 2
    assert Message.objects.claimed().count() == 1
    assert Message.objects.ready().count() == 2
