"""Topic rows changed by hand, in-process: the pump, the sequencer and the operators'
commands each hold up at most the group or topic concerned, and say what is wrong.
(With real workers: tests/test_topic_hostile_rows.py.)"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from django_mysqlq import Topic, broker
from django_mysqlq.broker import deliveries, oversized
from django_mysqlq.conf import get_settings
from django_mysqlq.models import TopicDelivery, TopicGroup, TopicMessage, TopicState
from django_mysqlq.topicnames import delivery_task_name, group_queue
from django_mysqlq.topics import Subscription, TopicEvent
from django_mysqlq.worker.topics import BroadcastReader, TopicDuty
from tests.conftest import held_by_stranger, raw_connection
from tests.packet_support import server_packet

pytestmark = pytest.mark.django_db(transaction=True)


def spec(topic: str, group: str) -> broker.GroupSpec:
    return broker.GroupSpec(topic=topic, group=group, queue=group_queue(group),
                            task_name=delivery_task_name(topic, group), on_dead="skip",
                            max_attempts=3, retry_backoff=0.1, timeout=None, start="earliest")


def test_the_pump_stops_before_a_message_too_big_and_never_reads_one_past_the_room(
        monkeypatch) -> None:
    """A room of 3,000 bytes a row: a 2,900-byte payload is read but its delivery (with
    its wrapper and columns) does not fit; a 5,000-byte one is not even read."""
    room = 3000
    monkeypatch.setattr(deliveries, "row_room", lambda alias=None: room)
    billing = spec("sized", "billing")
    Topic("sized").publish_many(["a", "b", "x" * 2900, "c", "y" * 5000, "d"])
    broker.sequence("sized")
    broker.create_group(billing)
    pumped = broker.pump_group(billing, batch=100, window=100)
    assert (pumped.made, pumped.oversized) == (2, deliveries.Oversized(3, pumped.oversized
                                                                       .size, room))
    assert pumped.oversized is not None and pumped.oversized.size > room
    assert broker.position("sized", "billing") == 2
    again = broker.pump_group(billing, batch=100, window=100)
    assert (again.made, again.oversized) == (0, pumped.oversized)  # stays before it
    text = pumped.oversized.describe("sized", "billing")
    assert "Group 'billing' of topic 'sized' stops before offset 3" in text
    assert "queuetopic reset billing --topic sized --to-offset 4" in text
    broker.reset_group("sized", "billing", broker.ResetTarget(to_offset=4),
                       broker.Operator("cli:test"))
    past = broker.pump_group(billing, batch=100, window=100)
    assert past.made == 1 and past.oversized is not None
    assert (past.oversized.offset, past.oversized.size) == (5, 5002)  # its length, unread
    assert broker.position("sized", "billing") == 4
    assert sorted(TopicDelivery.objects.filter(topic="sized").values_list(
        "offset", flat=True)) == [1, 2, 4]
    assert TopicMessage.objects.filter(topic="sized").count() == 6


def set_topic(name: str, **columns: int) -> None:
    TopicState.objects.filter(name=name).update(**columns)


@pytest.mark.parametrize("tamper", ["last_offset lowered", "an offset moved past it"])
def test_a_counter_behind_the_offsets_given_out_is_repaired_once_and_logged(tamper, caplog):
    """The next offset would be one a message has: the unique index refused every round's
    stamp, so the topic was never sequenced again, and every member's loop failed."""
    topic = Topic("counted")
    billing = spec("counted", "billing")
    topic.publish_many(["a", "b", "c"])
    broker.sequence("counted")
    broker.create_group(billing)
    if tamper == "last_offset lowered":
        set_topic("counted", last_offset=1)
        highest = 3
    else:
        TopicMessage.objects.filter(topic="counted", offset=3).update(offset=7)
        highest = 7
    topic.publish_many(["d", "e", "f", "g", "h"])  # offsets up to 8 would collide
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        assert broker.sequence("counted") == 5
        topic.publish("i")
        assert broker.sequence("counted") == 1
    later = TopicMessage.objects.filter(topic="counted").exclude(payload__in=['"a"', '"b"',
                                                                               '"c"'])
    assert sorted(later.values_list("offset", flat=True)) == list(range(highest + 1,
                                                                        highest + 7))
    assert broker.last_offset("counted") == highest + 6
    [record] = [r for r in caplog.records if "counted" in r.getMessage()]
    assert f"offsets up to {highest}" in record.getMessage()
    assert broker.pump(billing, batch=100, window=100) == 9
    assert broker.position("counted", "billing") == highest + 6


def test_a_group_row_held_by_a_stranger_holds_up_that_group_only() -> None:
    """Its pump skips it; a member's start (create_group) reads it without waiting: the
    INSERT IGNORE it ran waited out the stranger's lock (innodb_lock_wait_timeout)."""
    billing, audit = spec("guarded", "billing"), spec("guarded", "audit")
    Topic("guarded").publish_many(["a", "b"])
    broker.sequence("guarded")
    broker.create_group(billing)
    broker.create_group(audit)
    conn = raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute("START TRANSACTION")
        cursor.execute("SELECT * FROM mysqlq_topic_group WHERE topic = 'guarded' AND "
                       "group_name = 'billing' FOR UPDATE")
        began = time.monotonic()
        assert broker.create_group(billing) is False
        assert broker.pump(billing, batch=10, window=10) == 0
        assert broker.pump(audit, batch=10, window=10) == 2
        assert time.monotonic() - began < 2
    finally:
        conn.rollback()
        conn.close()
    assert broker.pump(billing, batch=10, window=10) == 2


def test_a_group_row_deleted_while_its_members_run_is_made_again_after_its_last_delivery(
        caplog) -> None:
    billing = spec("dropped", "billing")
    topic = Topic("dropped")
    topic.publish_many(["a", "b", "c"])
    broker.sequence("dropped")
    broker.create_group(billing)
    assert broker.pump(billing, batch=2, window=10) == 2
    TopicGroup.objects.filter(topic="dropped").delete()
    topic.publish("d")
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        assert broker.pump_group(billing, batch=10, window=10).made == 0  # not asked
        assert broker.pump_group(billing, batch=10, window=10, recreate=True).made == 0
    assert "Group 'billing' of topic 'dropped' had no row" in caplog.text
    assert "position 2" in caplog.text
    assert sum(broker.pump_group(billing, batch=10, window=10, sequence=True).made
               for _ in range(3)) == 2
    assert sorted(TopicDelivery.objects.filter(topic="dropped").values_list(
        "offset", flat=True)) == [1, 2, 3, 4]  # none lost, none twice


def test_a_negative_position_delivers_from_the_first_kept_message() -> None:
    """(A position past the last offset: tests/test_topic_past_end.py.)"""
    billing = spec("negative", "billing")
    Topic("negative").publish_many(["a", "b"])
    broker.sequence("negative")
    broker.create_group(billing)
    TopicGroup.objects.filter(topic="negative").update(position=-5)
    assert broker.pump_group(billing, batch=10, window=10).made == 2
    assert broker.position("negative", "billing") == 2


def test_a_row_fixed_by_hand_clears_the_note_at_the_next_look(caplog) -> None:
    """A row fixed by hand so that the group has every message leaves nothing to pump: no
    move of the position clears the note. Before, it stayed (and the admin said
    "stopped") until the next publish."""
    billing = spec("putback", "billing")
    Topic("putback").publish_many(["a", "b"])
    broker.sequence("putback")
    broker.create_group(billing)
    TopicGroup.objects.filter(topic="putback").update(position=2)
    duty = TopicDuty([], threading.Event(), get_settings())
    assert broker.note_pump_problem("putback", "billing", "its pump failed: fixed since")
    pumped = broker.pump_group(billing, batch=10, window=10, sequence=True)
    assert pumped == broker.Pumped(0, False, noted=True)
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        duty.trouble.pumped(billing, pumped)
    [state] = broker.groups("putback", "billing")
    assert (state.pump_problem, state.pump_problem_at) == ("", None)
    assert "the note of its problem is cleared" in caplog.text
    assert broker.pump_group(billing, batch=10, window=10) == broker.Pumped(0, False)
    # A group still behind keeps its note: its pump has not shown it can go on.
    TopicGroup.objects.filter(topic="putback").update(position=0)
    assert broker.note_pump_problem("putback", "billing", "its pump failed: x")
    behind = broker.Pumped(0, True, noted=True)  # (its row was held: it tried nothing)
    duty.trouble.pumped(billing, behind)
    assert broker.groups("putback", "billing")[0].pump_problem == "its pump failed: x"


def test_clearing_a_note_skips_a_row_held_by_a_stranger() -> None:
    billing = spec("heldnote", "billing")
    Topic("heldnote").publish("a")
    broker.sequence("heldnote")
    broker.create_group(billing)
    assert broker.note_pump_problem("heldnote", "billing", "its pump failed: x")
    with held_by_stranger("SELECT id FROM mysqlq_topic_group WHERE topic = 'heldnote'"
                          " FOR UPDATE"):
        started = time.monotonic()
        assert not broker.clear_pump_problem("heldnote", "billing")
        assert time.monotonic() - started < 1.0  # not waited for (lock wait: 50 s)
    assert broker.clear_pump_problem("heldnote", "billing")
    assert not broker.clear_pump_problem("heldnote", "billing")  # nothing left to clear
    assert broker.groups("heldnote", "billing")[0].pump_problem == ""


def test_a_delivery_whose_link_row_was_deleted_still_runs_and_lookup_shows_the_rest(
        ) -> None:
    billing, audit = spec("unlinked", "billing"), spec("unlinked", "audit")
    Topic("unlinked").publish({"n": 1})
    broker.sequence("unlinked")
    for group in (billing, audit):
        broker.create_group(group)
        assert broker.pump(group, batch=10, window=10) == 1
    TopicDelivery.objects.filter(topic="unlinked", group_name="billing").delete()
    out = StringIO()
    call_command("queuetopic", "lookup", "--topic", "unlinked", "--offset", "1", stdout=out)
    assert "unlinked@1" in out.getvalue() and "audit: #" in out.getvalue()
    assert "  billing: no delivery record (its link row is missing)" in out.getvalue()
    claimed = broker.claim(["group:billing"], 10, "w", lease_seconds=30)
    assert [m.task_name for m in claimed] == ["topic:unlinked:billing"]  # still runs


def broadcast_reader(topic: str) -> tuple[BroadcastReader, list[TopicEvent]]:
    """A broadcast reader of ``topic`` started at its latest offset, and what it got."""
    got: list[TopicEvent] = []
    reader = BroadcastReader([Subscription(topic, got.append, None)], threading.Event(),
                             poll=0.1)
    reader.begin()
    return reader, got


def test_the_broadcast_reader_skips_a_message_past_the_room_and_goes_on(
        monkeypatch, caplog) -> None:
    """A room of 3,000 bytes a row (a packet lowered since the publish): a 5,000-byte
    payload is not read; it is skipped, logged by topic and offset, and the messages
    after it reach the handlers."""
    reader, got = broadcast_reader("wide")
    monkeypatch.setattr(oversized, "row_room", lambda alias=None: 3000)
    Topic("wide").publish_many(["a", "x" * 2900, "y" * 5000, "b"])
    broker.sequence("wide")
    with caplog.at_level(logging.ERROR, "django_mysqlq"):
        assert reader.read_once() == 4
    assert [event.payload for event in got] == ["a", "x" * 2900, "b"]
    assert reader.positions["wide"] == 4
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage().startswith(
        "Broadcast message wide@3 is too big to read: its payload takes 5002 bytes, more "
        "than the server's max_allowed_packet allows in one row (3000): skipped.")
    assert reader.read_once() == 0


def store_past_the_packet(topic: str, size: int, folder: Path) -> None:
    """A message row longer than the server's packet, stored the one way a client can
    (``LOAD DATA LOCAL INFILE``: no statement carries it); skips where it is refused."""
    import MySQLdb

    data = folder / "row.tsv"
    data.write_text(f'{topic}\t"{"z" * size}"\n')
    conn = raw_connection(local_infile=1)
    try:
        conn.cursor().execute(
            f"LOAD DATA LOCAL INFILE '{data}' INTO TABLE mysqlq_topic_message "
            "(topic, payload) SET published_at = UTC_TIMESTAMP(6)")
    except MySQLdb.OperationalError as exc:
        pytest.skip(f"the server refuses LOAD DATA LOCAL INFILE ({exc})")
    finally:
        conn.close()


def test_the_broadcast_reader_gets_past_a_row_bigger_than_the_servers_packet(
        tmp_path, caplog) -> None:
    """The driver reads such a row whole (up to its own 1 GiB, past which the read
    failed at every poll, forever): before, the handlers got it, a message no group of
    the topic can get; now it is skipped like one past the room."""
    packet = server_packet()
    if packet > 64 * 2**20:
        pytest.skip(f"max_allowed_packet is {packet} bytes: too big a row to make here")
    reader, got = broadcast_reader("wide")
    Topic("wide").publish("a")
    store_past_the_packet("wide", packet + 1024, tmp_path)
    Topic("wide").publish("b")
    broker.sequence("wide")
    with caplog.at_level(logging.ERROR, "django_mysqlq"):
        assert reader.read_once() == 3
    assert [event.payload for event in got] == ["a", "b"]
    assert "Broadcast message wide@2 is too big to read" in caplog.text


def test_a_first_offset_set_past_the_last_misleads_no_reader(caplog) -> None:
    """first_offset 100 while offsets 1-3 are kept (changed by hand). Before, a new
    earliest group and a reset to the earliest went to position 99 (skipping whatever
    came between), lag counted none of the 3, replay said nothing was kept, and
    retention found nothing to delete for good."""
    Topic("firsts").publish_many(["a", "b", "c"])
    broker.sequence("firsts")
    set_topic("firsts", first_offset=100)
    billing = spec("firsts", "billing")  # start: earliest
    who = broker.Operator("cli:test")
    with caplog.at_level(logging.ERROR, "django_mysqlq"):
        broker.create_group(billing)
        assert broker.position("firsts", "billing") == 0
        [state] = broker.groups("firsts")
        assert (state.first_offset, state.not_pumped, state.lag) == (1, 3, 3)
        assert broker.topic_bounds("firsts") == (1, 3)
        assert broker.pump(billing, batch=1, window=10) == 1
        assert broker.replay_range(billing, 1, 1, who).replayed == 1
        done = broker.reset_group("firsts", "billing", broker.ResetTarget(edge="earliest"), who)
        assert done.new_position == 0
        assert broker.pump(billing, batch=1, window=10) == 1
        # Retention waits for the group (at 1) and puts first_offset right.
        future = broker.database_now() + dt.timedelta(days=1)
        assert broker.prune_topic_batch("firsts", future, 100) == 1
    assert TopicState.objects.get(name="firsts").first_offset == 2
    assert sorted(TopicMessage.objects.filter(topic="firsts").values_list(
        "offset", flat=True)) == [2, 3]
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error.startswith("Topic 'firsts': its first_offset in mysqlq_topic is 100, which "
                            "can't be true with its last_offset 3")
    assert "go by its lowest kept offset, 1 instead" in error


def test_an_offset_set_back_to_null_is_stamped_again_and_said_once(caplog) -> None:
    """``UPDATE mysqlq_topic_message SET msg_offset = NULL`` on a sequenced message: the
    next round gave it a new offset and every group got it again, and nothing said so."""
    topic = Topic("cleared")
    billing = spec("cleared", "billing")
    topic.publish_many(["a", "b", "c"])
    broker.sequence("cleared")
    broker.create_group(billing)
    assert broker.pump(billing, batch=100, window=100) == 3
    cleared = TopicMessage.objects.get(topic="cleared", offset=2)
    TopicMessage.objects.filter(pk=cleared.pk).update(offset=None)
    topic.publish("d")
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        assert broker.sequence("cleared") == 2
    assert TopicMessage.objects.get(pk=cleared.pk).offset == 4  # lowest id first
    assert TopicMessage.objects.get(topic="cleared", payload='"d"').offset == 5
    [record] = [r for r in caplog.records if "'cleared'" in r.getMessage()]
    said = record.getMessage()
    assert record.levelno == logging.ERROR
    assert said.startswith("Topic 'cleared': 1 message(s) sequenced before had no offset")
    assert cleared.sequenced_at is not None
    assert (f"id {cleared.pk} (sequenced {cleared.sequenced_at.isoformat()}, now offset 4)"
            in said)
    assert "every consumer group and broadcast reader gets them again" in said
    assert "queuetopic replay --topic cleared --group <group>" in said
    assert "queuetopic reset <group> --topic cleared --to-offset <offset>" in said
    caplog.clear()
    topic.publish("e")
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        assert broker.sequence("cleared") == 1
    assert not caplog.records  # an ordinary round says nothing
    assert broker.pump(billing, batch=100, window=100) == 3  # again, d, e: none lost
    assert sorted(TopicDelivery.objects.filter(topic="cleared").values_list(
        "offset", flat=True)) == [1, 2, 3, 4, 5, 6]


def test_many_offsets_set_back_to_null_are_said_once_a_round_naming_the_first(
        caplog) -> None:
    Topic("cleared").publish_many([str(n) for n in range(15)])
    broker.sequence("cleared")
    TopicMessage.objects.filter(topic="cleared", offset__gt=3).update(offset=None)
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        assert broker.sequence("cleared", batch=100) == 12
    [record] = caplog.records
    assert "12 message(s) sequenced before" in record.getMessage()
    assert "now offset 25) and 2 more." in record.getMessage()
    assert broker.last_offset("cleared") == 27
