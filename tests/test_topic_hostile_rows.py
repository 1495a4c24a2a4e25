"""Hostile rows in the topic tables, with a real worker: a stored message too big for its
delivery, tampered message, group and topic rows. Each must hold up at most its own group
(never the worker's other groups and queues), and say what is wrong and what to do.

Timeouts below are liveness bounds, never performance assertions.
"""

from __future__ import annotations

import json
import signal
import time
from io import StringIO

import pytest
from django.core.management import call_command

from django_mysqlq import broker
from django_mysqlq.broker import topics
from django_mysqlq.models import Message, TopicGroup, TopicMessage
from tests.burst import assert_succeeded, enqueue_good
from tests.conftest import raw_connection, wait_for
from tests.packet_support import server_packet
from tests.testapp import topic_handlers, topic_ops_handlers
from tests.testapp.models import GateRun
from tests.topic_ops_support import holding_topic_row

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

ENV = {"MYSQLQ_TEST_EXTRA_TASK_MODULES":
       "tests.testapp.topic_handlers,tests.testapp.topic_ops_handlers"}
WORKER = ("--concurrency", "2")


def started(worker) -> None:
    wait_for(lambda: "started: queues=" in worker.output(), timeout=60,
             message="the worker to start")


def stopped(worker) -> str:
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()[-3000:]
    return worker.output()


def handled(label: str, group: str) -> set[int]:
    return set(GateRun.objects.filter(label=label, key__startswith=f"{group}:", edge="end",
                                      outcome="ok").values_list("seq", flat=True))


def insert_raw(topic: str, payload: str, key: str | None = None) -> int:
    """A message row written past publish's checks (a stranger, an old version)."""
    conn = raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute("INSERT INTO mysqlq_topic_message (topic, msg_key, payload, "
                       "published_at) VALUES (%s, %s, %s, UTC_TIMESTAMP(6))",
                       [topic, key, payload])
        return int(cursor.lastrowid)
    finally:
        conn.close()


def offset_of(row_id: int) -> int:
    wait_for(lambda: TopicMessage.objects.get(pk=row_id).offset is not None, timeout=20,
             message="the row to get its offset")
    return int(TopicMessage.objects.get(pk=row_id).offset)


def queuetopic(*args: str) -> str:
    out = StringIO()
    call_command("queuetopic", *args, stdout=out)
    return out.getvalue()


def test_a_stored_message_too_big_for_its_delivery_stops_only_its_groups(start_worker):
    """A row a publisher of an older version (or a stranger) stored just under the packet:
    its delivery (the payload in a wrapper, with the queue's columns) would pass it. Every
    group of the topic stops before it, once logged with the way out; the messages before
    it, the other topic's group and the task queue flow; a reset past it lets the group
    go on."""
    label = "oversized"
    worker = start_worker(*WORKER, env=ENV)
    started(worker)
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (0, 1)])
    head = json.dumps({"label": label, "seq": 2, "pad": ""})
    big = head[:-2] + "x" * (server_packet() - 400 - len(head)) + "\"}"
    big_id = insert_raw("ledger", big)
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (3, 4)])
    wait_for(lambda: handled(label, "billing") == {0, 1}, timeout=20,
             message="billing to handle the messages before the big one")
    big_offset = offset_of(big_id)
    topic_ops_handlers.feed.publish({"label": label, "seq": 10})
    tasks = [enqueue_good(f"{label}-{i}") for i in range(3)]
    wait_for(lambda: handled(label, "ops") == {10}, timeout=20,
             message="the other topic's group to be served meanwhile")
    wait_for(lambda: not Message.objects.filter(pk__in=tasks).exists(), timeout=20,
             message="the task queue to be served meanwhile")
    assert_succeeded(*tasks)
    for group in ("billing", "audit", "broken"):
        assert TopicGroup.objects.get(topic="ledger", group_name=group).position \
            == big_offset - 1
    output = worker.output()
    for group in ("billing", "audit", "broken"):
        line = (f"Group '{group}' of topic 'ledger' stops before offset {big_offset}")
        assert output.count(line) == 1, output[-3000:]
    assert "max_allowed_packet" in output
    assert f"queuetopic reset billing --topic ledger --to-offset {big_offset + 1}" in output
    assert "Database error in the worker loop" not in output
    # ... and said on the group's row, beside the lag it explains.
    [state] = broker.groups("ledger", "billing")
    assert state.pump_problem.startswith(
        f"Group 'billing' of topic 'ledger' stops before offset {big_offset}"), state
    queuetopic("reset", "billing", "--topic", "ledger", "--to-offset", str(big_offset + 1))
    assert broker.groups("ledger", "billing")[0].pump_problem == ""
    wait_for(lambda: handled(label, "billing") == {0, 1, 3, 4}, timeout=20,
             message="billing to go on after the reset")
    stopped(worker)


def test_a_stranger_holding_the_topic_row_blocks_no_publisher_and_no_other_work(
        start_worker):
    """The counter's row locked: publish is a plain insert and never waits; the members go
    on with what is sequenced and with their other groups and queues, a worker starts;
    the new messages get offsets once the lock is gone."""
    label = "topic-row-held"
    worker = start_worker(*WORKER, env=ENV)
    started(worker)
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (0, 1)])
    wait_for(lambda: handled(label, "billing") == {0, 1}, timeout=20,
             message="billing to handle the first messages")
    stranger = holding_topic_row("ledger")
    try:
        began = time.monotonic()
        topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (2, 3)])
        assert time.monotonic() - began < 1.0
        late = start_worker(*WORKER, env=ENV)
        topic_ops_handlers.feed.publish({"label": label, "seq": 10})
        tasks = [enqueue_good(f"{label}-{i}") for i in range(3)]
        wait_for(lambda: handled(label, "ops") == {10}, timeout=20,
                 message="the other topic's group to be served meanwhile")
        wait_for(lambda: not Message.objects.filter(pk__in=tasks).exists(), timeout=20,
                 message="the task queue to be served meanwhile")
        started(late)
        assert handled(label, "billing") == {0, 1}
        wait_for(lambda: "Topic 'ledger': another session has held its row" in
                 worker.output(), timeout=15, message="the held row to be logged")
    finally:
        stranger.release()
    wait_for(lambda: handled(label, "billing") == {0, 1, 2, 3}, timeout=20,
             message="the messages published meanwhile, once the lock is gone")
    assert_succeeded(*tasks)
    # The late member may have delivered them: the first one says the row is free at its
    # own next look (after its pause for the held row, up to a second), not before.
    wait_for(lambda: "Topic 'ledger': its row is free again" in worker.output(), timeout=15,
             message="the first member to log that the row is free again")
    stopped(late)
    output = stopped(worker)
    assert output.count("Topic 'ledger': another session has held its row") == 1
    assert "Database error in the worker loop" not in output


def test_a_message_changed_into_bad_json_fails_its_delivery_not_the_pump(start_worker):
    label = "bad-json"
    worker = start_worker(*WORKER, "--groups", "billing", env=ENV)
    started(worker)
    bad_id = insert_raw("ledger", '{"label": "bad-json", "seq": ')
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (1, 2)])
    wait_for(lambda: handled(label, "billing") == {1, 2}, timeout=20,
             message="billing to handle the messages after the bad one")
    bad_offset = offset_of(bad_id)
    wait_for(lambda: Message.objects.filter(task_name="topic:ledger:billing",
                                            status="dead").exists(), timeout=20,
             message="the bad message's delivery to go dead")
    dead = Message.objects.get(task_name="topic:ledger:billing", status="dead")
    assert "JSON" in dead.last_error
    trace = queuetopic("lookup", "--topic", "ledger", "--offset", str(bad_offset))
    assert f"billing: #{dead.pk} dead" in trace and "JSON" in trace, trace
    output = stopped(worker)
    assert "Database error in the worker loop" not in output


def test_a_zero_publish_time_fails_its_delivery_and_skips_its_broadcast_not_the_worker(
        start_worker):
    """The driver reads a zero date (MariaDB's default sql_mode lets one be stored) as
    None: the pump's and the broadcast reader's date handling raised on it, which no
    `except DatabaseError` caught. The pump's error ended the worker (and every member
    after it); the reader's ended its thread, so the process heard no more broadcasts."""
    label = "zero-date"
    worker = start_worker(*WORKER, "--groups", "billing", env=ENV)
    started(worker)
    wait_for(lambda: TopicGroup.objects.filter(topic="ledger", group_name="billing").exists(),
             message="the group's row")
    bad_id = insert_raw("ledger", json.dumps({"label": label, "seq": 0}))
    conn = raw_connection()
    try:
        conn.cursor().execute("UPDATE mysqlq_topic_message SET published_at = "
                              "'0000-00-00 00:00:00' WHERE id = %s", [bad_id])
    finally:
        conn.close()
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (1, 2)])
    wait_for(lambda: handled(label, "billing") == {1, 2}, timeout=20,
             message="billing to handle the messages after the zero-dated one")
    wait_for(lambda: set(GateRun.objects.filter(label=f"{label}/broadcast", pid=worker.pid)
                         .values_list("seq", flat=True)) == {1, 2}, timeout=20,
             message="the broadcast reader to go on past it")
    wait_for(lambda: "has no publish time" in (Message.objects.filter(
        task_name="topic:ledger:billing").values_list("last_error", flat=True).first() or ""),
        timeout=20, message="its delivery to fail saying why")
    output = stopped(worker)  # (exit status 0: it ran to the stop)
    assert "was changed by hand (its published_at is a zero date): skipped" in output
    assert "Group 'billing' of topic 'ledger': its pump failed" not in output


def waiting_for_topic_row(topic: str) -> bool:
    """Whether a session waits for the topic's row (a waiting sequencing round; the
    server shows it as a running statement, not in INNODB_LOCK_WAITS)."""
    conn = raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO = %s",
                       [topics.LOCK_TOPIC_SQL.replace("%s", f"'{topic}'")])
        return bool(cursor.fetchone()[0])
    finally:
        conn.close()


def test_a_group_made_as_its_worker_starts_begins_after_a_backlog_being_stamped(
        start_worker):
    """Messages published while no worker ran; a worker starts, making the ``latest``
    group ``billing``, while another session holds the topic's row (as a process
    stamping that backlog does). The group was made at the offset from before the
    backlog and got it all; now the start waits for the round (bounded), and the group
    and the broadcast reader begin after it."""
    label = "made-late"
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (0, 1, 2)])
    stranger = holding_topic_row("ledger")
    try:
        # (The start's bound raised to 10 s: room for a slow machine to see it wait.)
        worker = start_worker(*WORKER, env={**ENV, "MYSQLQ_TEST_UPKEEP_LOCK_WAIT": "10"})
        # Released as soon as the start waits for the row (before its bound); a start
        # that does not wait is let go once it has started.
        wait_for(lambda: waiting_for_topic_row("ledger")
                 or "started: queues=" in worker.output(),
                 timeout=60, message="the worker's start to wait for the row")
    finally:
        stranger.release()
    started(worker)
    topic_handlers.ledger.publish_many([{"label": label, "seq": seq} for seq in (3, 4)])
    wait_for(lambda: handled(label, "billing") >= {3, 4}, timeout=20,
             message="billing to handle the messages published after the start")
    def heard() -> set[int]:
        return set(GateRun.objects.filter(label=f"{label}/broadcast").values_list(
            "seq", flat=True))

    wait_for(lambda: heard() >= {3, 4}, timeout=20,
             message="the broadcast reader to hear the messages published after the start")
    output = stopped(worker)
    assert handled(label, "billing") == {3, 4}, output[-3000:]
    assert heard() == {3, 4}
    assert "another session held its row" not in output
