"""Topic retention: old messages deleted in short batches by primary key, oldest offset
first, ``first_offset`` moved, links deleted; unread ones kept until every group passed
them (unless told otherwise); an open publisher is not blocked; a reset to a deleted
offset is refused clearly."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import DatabaseError, connection, connections
from django.test import override_settings

from django_mysqlq import broker
from django_mysqlq.conf import get_settings
from django_mysqlq.models import Message, TopicDelivery, TopicMessage, TopicState
from django_mysqlq.worker import topic_retention, troubles
from django_mysqlq.worker.topics import TopicDuty
from django_mysqlq.worker.upkeep import Housekeeping
from tests.conftest import raw_connection
from tests.operator_support import OPERATOR
from tests.topic_ops_support import forget_before, group, handle, open_publisher, publish

pytestmark = pytest.mark.django_db(transaction=True)

NOW = dt.datetime.now(dt.UTC)


def age(topic: str, offsets: range, days: float) -> None:
    TopicMessage.objects.filter(topic=topic, offset__in=list(offsets)).update(
        published_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=days))


def kept(topic: str) -> list[int]:
    return sorted(TopicMessage.objects.filter(topic=topic).values_list("offset", flat=True))


def test_old_messages_passed_by_every_group_go_in_batches() -> None:
    billing = group("orders", "billing")
    group("orders", "audit")
    publish("orders", 10)
    age("orders", range(1, 9), days=10)
    broker.pump(billing, batch=6, window=100)
    handle(billing, 6)
    cut = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
    # audit has not read anything: nothing may go yet.
    assert broker.prune_topic_batch("orders", cut, 3) == 0
    audit = broker.GroupSpec(**{**billing.__dict__, "group": "audit", "queue": "group:audit",
                                "task_name": "topic:orders:audit"})
    broker.pump(audit, batch=4, window=100)
    assert broker.prune_topic_batch("orders", cut, 3) == 3  # a batch is at most 3
    assert kept("orders") == list(range(4, 11))
    assert TopicState.objects.get(name="orders").first_offset == 4
    assert broker.prune_topic_batch("orders", cut, 3) == 1  # audit is at 4
    assert not TopicDelivery.objects.filter(offset__lt=5).exists()
    assert TopicDelivery.objects.filter(group_name="billing").count() == 2  # offsets 5, 6
    broker.pump(audit, batch=100, window=100)
    assert broker.prune_topic_batch("orders", cut, 100) == 2  # billing is at 6
    broker.pump(billing, batch=100, window=100)
    assert broker.prune_topic_batch("orders", cut, 100) == 2  # 7, 8: 9 and 10 are new
    assert kept("orders") == [9, 10] and TopicState.objects.get(name="orders").first_offset == 9
    with pytest.raises(broker.TopicOffsetError, match="no longer keeps offset 2"):
        broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=2), OPERATOR)
    broker.reset_group("orders", "billing", broker.ResetTarget(edge="earliest"), OPERATOR)
    assert broker.position("orders", "billing") == 8
    assert broker.groups("orders", "billing")[0].first_offset == 9


def test_time_alone_when_not_waiting_for_groups() -> None:
    group("orders", "billing")
    publish("orders", 5)
    age("orders", range(1, 4), days=10)
    cut = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
    assert broker.prune_topic_batch("orders", cut, 100) == 0
    assert broker.prune_topic_batch("orders", cut, 100, wait_for_groups=False) == 3
    # The group, far behind, continues at the first kept message: its lag counts only
    # what is kept (4 and 5), not what retention deleted; its position stays as stored.
    state = broker.groups("orders", "billing")[0]
    assert (state.position, state.first_offset, state.lag) == (0, 4, 2)


def test_an_open_publisher_and_the_sequencer_are_not_blocked() -> None:
    publish("orders", 6)
    group("orders", "billing", start="latest")  # at 6: it has passed them
    age("orders", range(1, 7), days=10)
    with open_publisher("orders", {"n": "late"}):
        began = time.monotonic()
        cut = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
        assert broker.prune_topic_batch("orders", cut, 100) == 6
        assert time.monotonic() - began < 2.0
    assert broker.sequence("orders") == 1
    assert kept("orders") == [7]


def test_the_leader_prunes_with_the_settings() -> None:
    group("orders", "billing")
    publish("orders", 600)
    age("orders", range(1, 501), days=2)
    with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400,
                                   "TOPIC_RETENTION_WAIT_FOR_GROUPS": False}):
        assert topic_retention.prune() == {"orders": 500}
    assert kept("orders") == list(range(501, 601))
    with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": None}):
        age("orders", range(501, 601), days=2)
        assert topic_retention.prune() == {}
    with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400}):
        assert topic_retention.prune() == {}  # billing has not read them


def test_lag_behind_what_retention_deleted_counts_only_what_is_kept() -> None:
    """Not waiting for groups, retention deletes what a group never read: its lag was
    ``last_offset - position`` (8 here) with no oldest message ("-"), its deleted offset
    1 having no publish time. It counts from the first kept offset now."""
    import io
    import json

    from django.core.management import call_command

    billing = group("orders", "billing")
    publish("orders", 10)
    age("orders", range(1, 9), days=10)
    with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400,
                                   "TOPIC_RETENTION_WAIT_FOR_GROUPS": False}):
        assert topic_retention.prune() == {"orders": 8}
    [state] = broker.groups("orders", "billing")
    assert (state.position, state.first_offset, state.last_offset) == (0, 9, 10)
    assert (state.not_pumped, state.lag, state.oldest_unhandled) == (2, 2, 9)
    assert state.oldest_age_seconds is not None and 0 <= state.oldest_age_seconds < 60
    out = io.StringIO()
    call_command("queuetopic", "groups", "--json", stdout=out)
    [row] = json.loads(out.getvalue())
    assert (row["position"], row["lag"], row["not_pumped"], row["oldest_unhandled"]) == (
        0, 2, 2, 9)
    out = io.StringIO()
    call_command("queuetopic", "groups", stdout=out)
    [line] = out.getvalue().splitlines()[1:]
    assert line.split()[:5] == ["orders", "billing", "0", "10", "2"]
    assert line.split()[5] != "-"  # the oldest unhandled's age
    # The pump agrees: 9 and 10 become deliveries, and the lag stays 2 until handled.
    assert broker.pump(billing, batch=100, window=100) == 2
    [state] = broker.groups("orders", "billing")
    assert (state.position, state.not_pumped, state.lag, state.oldest_unhandled) == (
        10, 0, 2, 9)


def test_the_oldest_age_of_a_delivery_whose_message_retention_deleted() -> None:
    """Retention deletes a message once every group passed it, a delivery of it still
    waiting: its age read only the message's row and showed '-' beside a lag of 3. It
    comes from the delivery now (its publish time; its enqueue time when unreadable)."""
    import io

    from django.core.management import call_command

    billing = group("orders", "billing")
    publish("orders", 3)
    age("orders", range(1, 4), days=10)
    broker.pump(billing, batch=100, window=100)  # position 3, three deliveries ready
    with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400}):
        assert topic_retention.prune() == {"orders": 3}
    assert kept("orders") == []
    [state] = broker.groups("orders", "billing")
    assert (state.lag, state.oldest_unhandled) == (3, 1)
    assert state.oldest_age_seconds is not None
    assert abs(state.oldest_age_seconds - 10 * 86400) < 120, state.oldest_age_seconds
    out = io.StringIO()
    call_command("queuetopic", "groups", stdout=out)
    [line] = out.getvalue().splitlines()[1:]
    assert line.split()[4:6] != ["3", "-"], line  # lag 3 with an age
    assert not TopicDelivery.objects.exists()  # their links went with them
    # A payload changed by hand: the delivery's enqueue time (an hour ago here).
    first = Message.objects.filter(task_name="topic:orders:billing").order_by("id")[0].pk
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_message SET payload = 'not json', enqueued_at = "
                       "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE id = %s", [first])
    [state] = broker.groups("orders", "billing")
    assert state.oldest_age_seconds is not None
    assert abs(state.oldest_age_seconds - 3600) < 120, state.oldest_age_seconds


def test_the_oldest_age_of_a_delivery_whose_message_went_before_its_link() -> None:
    """Retention deletes the links after the messages (in batches of their own): between
    the two, the oldest offset is known from its link and its age from its delivery."""
    billing = group("orders", "billing")
    publish("orders", 3)
    age("orders", range(1, 4), days=10)
    broker.pump(billing, batch=100, window=100)
    forget_before("orders", 3)  # messages 1 and 2 deleted, their links kept
    [state] = broker.groups("orders", "billing")
    assert (state.lag, state.oldest_unhandled) == (3, 1)
    assert state.oldest_age_seconds is not None
    assert abs(state.oldest_age_seconds - 10 * 86400) < 120, state.oldest_age_seconds


def test_a_lookup_of_an_offset_retention_deleted_says_so() -> None:
    """It said only "No message matches." for a deleted offset, a future one and an
    unknown topic alike."""
    import io

    from django.core.management import call_command

    group("orders", "billing")
    publish("orders", 10)
    age("orders", range(1, 5), days=10)
    with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400,
                                   "TOPIC_RETENTION_WAIT_FOR_GROUPS": False}):
        assert topic_retention.prune() == {"orders": 4}

    def lookup(*args: str) -> str:
        out = io.StringIO()
        call_command("queuetopic", "lookup", *args, stdout=out)
        return out.getvalue().strip()

    assert lookup("--topic", "orders", "--offset", "2") == (
        "No message matches: retention deleted the messages of topic 'orders' before "
        "offset 5 (it keeps offsets 5 to 10).")
    assert lookup("--topic", "orders", "--offset", "11") == (
        "No message matches: topic 'orders' has given offsets up to 10 so far.")
    assert lookup("--topic", "nothing", "--offset", "1").startswith(
        "No message matches: no message of topic 'nothing' has an offset yet")
    assert lookup("--topic", "orders", "--offset", "5").startswith("orders@5 ")


def test_a_zero_publish_time_is_older_than_any_cut_off_not_an_error() -> None:
    """The driver reads a zero date as None: retention's comparison raised on it, an
    error no upkeep step catches, and the recovery leader stopped (then the next)."""
    publish("orders", 3)
    group("orders", "billing", start="latest")  # at 3: it has passed them
    TopicMessage.objects.filter(topic="orders", offset=1).update(
        published_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=10))
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_topic_message SET published_at = '0000-00-00 00:00:00' "
                       "WHERE topic = 'orders' AND msg_offset = 2")
    cut = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
    assert broker.prune_topic_batch("orders", cut, 100) == 2
    assert kept("orders") == [3]


def test_a_reset_between_the_read_and_the_delete_rolls_the_batch_back(monkeypatch) -> None:
    """Retention reads the groups' positions before its delete transaction; a reset that
    moves a group back in between must keep the offsets it now needs (not skip them)."""
    from django_mysqlq.broker import topic_retention as broker_retention

    billing = group("orders", "billing")
    publish("orders", 10)
    age("orders", range(1, 11), days=10)
    broker.pump(billing, batch=100, window=100)
    handle(billing, 10)
    original = broker_retention.in_transaction

    def reset_first(alias, body):  # type: ignore[no-untyped-def]
        broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=3), OPERATOR)
        return original(alias, body)

    monkeypatch.setattr(broker_retention, "in_transaction", reset_first)
    cut = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
    assert broker.prune_topic_batch("orders", cut, 100) == 0
    assert kept("orders") == list(range(1, 11))
    assert TopicState.objects.get(name="orders").first_offset == 1
    monkeypatch.setattr(broker_retention, "in_transaction", original)
    assert broker.prune_topic_batch("orders", cut, 100) == 2  # now up to billing's 2
    assert kept("orders") == list(range(3, 11))


def test_a_reset_waits_for_an_open_retention_batch_and_sees_its_offsets_gone() -> None:
    """A retention batch holds the topic row from moving ``first_offset`` to its commit:
    a reset to an offset it deletes waits, then is refused (it would have skipped)."""
    group("orders", "billing")
    publish("orders", 10)
    stranger = raw_connection()
    outcome: list[object] = []
    try:
        cursor = stranger.cursor()
        cursor.execute("START TRANSACTION")  # what a retention batch does, before commit
        cursor.execute("DELETE FROM mysqlq_topic_message WHERE topic = 'orders' AND "
                       "msg_offset < 5")
        cursor.execute("UPDATE mysqlq_topic SET first_offset = 5 WHERE name = 'orders'")

        def reset() -> None:
            try:
                outcome.append(broker.reset_group(
                    "orders", "billing", broker.ResetTarget(to_offset=2), OPERATOR))
            except Exception as exc:  # noqa: BLE001 (the test reads it)
                outcome.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=reset)
        thread.start()
        time.sleep(0.5)
        assert not outcome, f"the reset did not wait for the batch: {outcome}"
        cursor.execute("COMMIT")
        thread.join(30)
    finally:
        stranger.close()
    assert len(outcome) == 1 and isinstance(outcome[0], broker.TopicOffsetError), outcome
    assert "no longer keeps offset 2" in str(outcome[0])
    assert broker.position("orders", "billing") == 0


def test_a_topic_held_by_a_stranger_does_not_stop_the_others_retention(monkeypatch,
                                                                         caplog) -> None:
    from django_mysqlq.broker import base

    for topic in ("a_held", "b_free"):
        publish(topic, 5)
        age(topic, range(1, 6), days=2)
    monkeypatch.setattr(base, "LOCK_RETRY_LIMIT", 1)
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
    stranger = raw_connection()
    try:
        cursor = stranger.cursor()
        cursor.execute("START TRANSACTION")
        cursor.execute("SELECT * FROM mysqlq_topic WHERE name = 'a_held' FOR UPDATE")
        with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400,
                                       "TOPIC_RETENTION_WAIT_FOR_GROUPS": False}):
            assert topic_retention.prune() == {"b_free": 5}
    finally:
        stranger.close()
    assert kept("a_held") == [1, 2, 3, 4, 5] and kept("b_free") == []
    assert "Retention of topic 'a_held' failed" in caplog.text
    # ... and on the worker's row (queuestats, the dashboard) until it works again.
    duty = TopicDuty([], threading.Event(), get_settings())
    found = troubles.now(Housekeeping("w1", 5), duty)
    assert "retention of topic 'a_held' (the recovery leader's) failing since" in found
    assert "1205" in found and "b_free" not in found
    with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400,
                                   "TOPIC_RETENTION_WAIT_FOR_GROUPS": False}):
        assert topic_retention.prune() == {"a_held": 5}
    assert "Retention of topic 'a_held' works again" in caplog.text
    assert troubles.now(Housekeeping("w1", 5), duty) == ""


def test_an_archive_delete_keeps_offsets_a_group_was_reset_back_into() -> None:
    """The archive plans a batch (every group past it), then a reset moves a group back
    into it (``first_offset`` still allowed it): the delete must keep those messages."""
    from django_mysqlq.broker import topic_retention as broker_retention

    billing = group("orders", "billing")
    publish("orders", 10)
    age("orders", range(1, 11), days=10)
    broker.pump(billing, batch=100, window=100)
    handle(billing, 10)
    cut = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
    assert broker_retention.archivable_offsets("orders", cut) == (1, 10, 10)
    ids = list(TopicMessage.objects.filter(topic="orders").order_by("offset")
               .values_list("id", flat=True))
    broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=5), OPERATOR)
    with pytest.raises(broker_retention.GroupMovedBack, match="at offset 4, below archived"):
        broker_retention.delete_archived("orders", ids)
    assert kept("orders") == list(range(1, 11))
    assert TopicState.objects.get(name="orders").first_offset == 1
    assert TopicDelivery.objects.filter(topic="orders").count() == 10
    assert broker_retention.delete_archived("orders", ids[:4]) == 4  # what it passed
    assert kept("orders") == list(range(5, 11))


def test_a_busy_topic_is_pruned_until_caught_up_or_out_of_budget(monkeypatch,
                                                                   caplog) -> None:
    """Full batches go on past five per upkeep while the budget lasts; a topic still
    behind when it runs out is warned about once, and said caught up later."""
    monkeypatch.setattr(topic_retention, "BATCH", 2)
    publish("orders", 30)
    age("orders", range(1, 31), days=2)
    settings = {"TOPIC_RETENTION_SECONDS": 86400, "TOPIC_RETENTION_WAIT_FOR_GROUPS": False}
    with override_settings(MYSQLQ=settings):
        assert topic_retention.prune() == {"orders": 30}  # not 5 batches of 2
    assert kept("orders") == [] and not topic_retention.behind
    publish("orders", 25)
    age("orders", range(31, 56), days=2)
    monkeypatch.setattr(topic_retention, "PRUNE_BUDGET_SECONDS", 0)
    with override_settings(MYSQLQ=settings):
        assert topic_retention.prune() == {"orders": 10}
        assert topic_retention.prune() == {"orders": 10}
        assert caplog.text.count("Retention of topic 'orders' is falling behind") == 1
        assert "caught up" not in caplog.text
        assert topic_retention.prune() == {"orders": 5}
    assert "Retention of topic 'orders' caught up with its cut-off" in caplog.text
    assert not topic_retention.behind


def test_a_table_held_by_a_stranger_gives_the_step_up_after_one_wait(caplog) -> None:
    """LOCK TABLES on the messages holds every topic alike: one wait, then the upkeep step
    is given up (its one warning), not a wait and an error per topic."""
    for topic in ("a", "b", "c"):
        publish(topic, 3)
        age(topic, range(1, 4), days=2)
    stranger = raw_connection()
    try:
        stranger.cursor().execute("LOCK TABLES mysqlq_topic_message READ")
        started = time.monotonic()
        with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400,
                                       "TOPIC_RETENTION_WAIT_FOR_GROUPS": False}), \
                broker.bounded_lock_waits(1), pytest.raises(DatabaseError) as raised:
            topic_retention.prune()
        waited = time.monotonic() - started
    finally:
        stranger.close()
    assert broker.is_lock_wait(raised.value)
    assert waited < 1.9, f"waited per topic: {waited:.1f} s"
    assert "Retention of topic" not in caplog.text
    assert kept("a") == kept("b") == kept("c") == [1, 2, 3]
