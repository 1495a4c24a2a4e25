"""The dashboard's and the operator actions' statements walk indexes (EXPLAIN), so one
dashboard load stays cheap however long the history grows (timings: bench/dashboard.py)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection

from django_mysqlq import broker
from django_mysqlq.broker import operate, overview, purge
from tests.plan_support import access, explain, tables

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def big_tables():
    """20,000 history rows over a week and 3,000 unfinished messages, statistics fresh."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO mysqlq_attempt (message_id, queue, task_name, attempt, outcome,
                   priority, enqueued_at, started_at, finished_at, worker_id, host, pid,
                   connection_id, thread, error_class, error_message, traceback, payload)
            SELECT seq, CONCAT('q', seq % 4), CONCAT('t', seq % 20), 1,
                   IF(seq % 10 = 0, 'failed', 'succeeded'), 0, t, t, t, '', '', NULL, NULL,
                   '', '', '', '', ''
              FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL seq * 30 SECOND AS t
                      FROM seq_1_to_20000) AS s""")
        cursor.execute("""
            INSERT INTO mysqlq_message (queue, task_name, payload, status, priority,
                   enqueued_at, run_at, attempts, max_attempts, retry_backoff, last_error)
            SELECT CONCAT('q', seq % 4), 't', '{}', ELT(1 + seq % 3, 'ready', 'scheduled',
                   'dead'), 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 0, 3, 1, ''
              FROM seq_1_to_3000""")
        for table in ("mysqlq_attempt", "mysqlq_message", "mysqlq_worker"):
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()


def test_the_plan_check_catches_a_full_scan(big_tables):
    unindexed = overview.HISTORY_WINDOW_SQL.replace("FORCE INDEX (mysqlq_att_finished)",
                                                  "IGNORE INDEX (mysqlq_att_finished)")
    assert access(unindexed, [60]) == [("mysqlq_attempt", None, "ALL")]


def test_history_window_is_a_range_of_the_finished_index_without_row_lookups(big_tables):
    [table] = tables(explain(overview.HISTORY_WINDOW_SQL, [60]))
    assert (table["key"], table["access_type"], table.get("using_index")) == (
        "mysqlq_att_finished", "range", True)


def test_queue_overview_dives_into_the_claim_index_once_per_group(big_tables):
    """The skip scan: each statement stops after one entry (or the capped count's)."""
    first = explain(overview.FIRST_GROUP_SQL, [])
    assert [(t["key"], t["access_type"]) for t in tables(first)] == [
        ("mysqlq_msg_claim", "index")]
    assert "filesort" not in json.dumps(first)
    after = explain(overview.NEXT_GROUP_SQL, ["q1", "q1", "ready", "ready", 0])
    assert [(t["key"], t["access_type"]) for t in tables(after)] == [
        ("mysqlq_msg_claim", "range")]
    assert "filesort" not in json.dumps(after)
    assert access(overview.NEXT_QUEUE_SQL, ["q1"]) == [
        ("mysqlq_message", "mysqlq_msg_claim", "range")]
    counted = [(t["table_name"], t.get("key"), t["access_type"])
               for t in tables(explain(overview.QUEUE_STATUS_COUNT_SQL,
                                       ["q1", "ready", "q1", "ready", 10_001]))]
    assert ("mysqlq_message", "mysqlq_msg_claim", "ref") in counted
    counted = [(t["table_name"], t.get("key"), t["access_type"])
               for t in tables(explain(overview.STATUS_COUNT_SQL, ["dead", "dead", 10_001]))]
    assert ("mysqlq_message", "mysqlq_msg_due", "ref") in counted
    ids = ", ".join(["%s"] * 4)
    assert access(overview.ENQUEUED_AT_SQL.format(ids=ids), [1, 2, 3, 4]) == [
        ("mysqlq_message", "PRIMARY", "range")]


def test_stuck_candidates_workers_and_purge_use_their_indexes(big_tables):
    assert access(operate.STUCK_CANDIDATES_SQL, []) == [
        ("mysqlq_message", "mysqlq_msg_lease", "ref")]
    assert access(overview.WORKERS_ALIVE_SQL, [30_000_000]) == [
        ("mysqlq_worker", "mysqlq_wrk_heartbeat", "range")]
    cutoff = broker.database_now().replace(tzinfo=None)
    plan = explain(purge.PURGE_SQL, [cutoff, 1000])
    [table] = tables(plan)
    assert (table["key"], table["access_type"]) == ("mysqlq_att_finished", "range")
    assert "filesort" not in json.dumps(plan)


def test_handlers_past_their_timeout_are_read_from_the_claimed_rows_only(big_tables):
    """The dashboard's "topic handlers past their timeout": a range of the claim index on
    queue LIKE 'group:%' would read every delivery of every group, dead letters included;
    the lease index's status = 'claimed' reads only what runs now."""
    from django_mysqlq.broker import topic_overview

    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO mysqlq_message (queue, task_name, payload, status, priority,
                   enqueued_at, run_at, attempts, max_attempts, retry_backoff, last_error,
                   timeout)
            SELECT CONCAT('group:g', seq % 3), 't', '{}', IF(seq % 500, 'dead', 'claimed'),
                   0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 0, 3, 1, '', 5
              FROM seq_1_to_5000""")
        cursor.execute("ANALYZE TABLE mysqlq_message")
        cursor.fetchall()
    [table] = tables(explain(topic_overview.OVERRAN_SQL, ["group:%", 100]))
    assert (table["key"], table["access_type"]) == ("mysqlq_msg_lease", "ref")
    assert table["rows"] < 100  # the claimed ones (10 here), not the 5,000 deliveries


def test_operator_row_locks_are_primary_key_lookups(big_tables):
    ids = ", ".join(["%s"] * 3)
    sql = operate._LOCK_OPERABLE_SQL.format(ids=ids, statuses="%s, %s, %s")
    assert access(sql, [1, 2, 3, "ready", "scheduled", "dead"]) == [
        ("mysqlq_message", "PRIMARY", "range")]


@pytest.fixture
def many_workers():
    """5,000 worker rows, one in five stopped, heartbeats spread over a month."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO mysqlq_worker (id, host, pid, queues, concurrency, started_at,
                   last_heartbeat, stopped_at, listening, processed, failed)
            SELECT CONCAT('w', seq), 'h', seq, 'default', 1, t, t, IF(seq % 5 = 0, t, NULL),
                   0, 0, 0
              FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL seq * 500 SECOND AS t
                      FROM seq_1_to_5000) AS s""")
        cursor.execute("ANALYZE TABLE mysqlq_worker")
        cursor.fetchall()


def test_retention_of_dead_messages_walks_the_due_index(big_tables):
    cutoff = broker.database_now().replace(tzinfo=None)
    plan = explain(purge.DEAD_BEFORE_SQL, [cutoff, 200])
    [table] = tables(plan)
    # ref on status = 'dead' or range on (status, run_at): either reads index entries in
    # run_at order and stops at the LIMIT, without touching the rows.
    assert (table["key"], table.get("using_index")) == ("mysqlq_msg_due", True)
    assert table["access_type"] in ("ref", "range")
    assert "filesort" not in json.dumps(plan)
    [(_, key, kind)] = access(purge.DEAD_COUNT_SQL, [cutoff])
    assert key == "mysqlq_msg_due" and kind in ("ref", "range")


def test_retention_of_worker_rows_walks_the_heartbeat_index(many_workers):
    cutoff = (broker.database_now() - dt.timedelta(days=7)).replace(tzinfo=None)
    plan = explain(purge.PURGE_WORKERS_SQL, [cutoff, 200])
    [table] = tables(plan)
    assert (table.get("key"), table["access_type"]) == ("mysqlq_wrk_heartbeat", "range")
    assert "filesort" not in json.dumps(plan)
    assert access(purge.WORKERS_COUNT_SQL, [cutoff]) == [
        ("mysqlq_worker", "mysqlq_wrk_heartbeat", "range")]
