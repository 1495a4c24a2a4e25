"""``manage.py queuetopic``: groups with position and lag, reset, replay and lookup with
the trace, against the real MariaDB (no worker process: the pump and acks are called the
way a worker calls them)."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_mysqlq import Topic, broker
from django_mysqlq.models import (
    Attempt,
    Message,
    MessageStatus,
    TopicDelivery,
    TopicGroup,
    TopicMessage,
)
from tests.operator_support import OPERATOR
from tests.topic_ops_support import (
    claim,
    forget_before,
    group,
    handle,
    open_publisher,
    publish,
)

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("queuetopic", *args, stdout=out)
    return out.getvalue()


def test_groups_show_position_lag_oldest_age_and_dead_letter() -> None:
    billing = group("orders", "billing")
    group("orders", "audit", start="latest")
    publish("orders", 10)
    broker.pump(billing, batch=6, window=100)
    handle(billing, 3)
    handle(billing, 1, fail=True)
    states = {g.group: g for g in broker.groups("orders")}
    b = states["billing"]
    assert (b.position, b.last_offset, b.not_pumped, b.dead) == (6, 10, 4, 1)
    assert b.lag == 4 + 2  # 4 not pumped, 2 ready deliveries; the dead one is not lag
    assert b.oldest_unhandled == 5  # offsets 1-3 handled, 4 dead
    assert b.oldest_age_seconds is not None and 0 <= b.oldest_age_seconds < 60
    assert (states["audit"].position, states["audit"].lag) == (0, 10)
    table = run("groups", "--topic", "orders")
    assert "billing" in table and "audit" in table
    data = {g["group"]: g for g in json.loads(run("groups", "--json"))}
    assert (data["billing"]["lag"], data["billing"]["dead"]) == (6, 1)
    assert data["audit"]["oldest_unhandled"] == 1


def test_lag_counts_messages_no_reader_has_sequenced_yet() -> None:
    """With every member of a topic's groups down, nothing gives new messages an offset:
    they are still lag (and their age the oldest unhandled's), not a lag of 0."""
    billing = group("orders", "billing", start="latest")
    Topic("orders").publish_many([{"n": i} for i in range(4)])  # no worker sequences them
    time.sleep(0.05)
    [state] = broker.groups("orders")
    assert (state.position, state.last_offset, state.unsequenced, state.lag) == (0, 0, 4, 4)
    assert state.oldest_unhandled is None  # no offset yet
    assert state.oldest_age_seconds is not None and 0 < state.oldest_age_seconds < 60
    [row] = json.loads(run("groups", "--json"))
    assert (row["lag"], row["unsequenced"]) == (4, 4)
    broker.sequence("orders")
    broker.pump(billing, batch=100, window=100)
    [state] = broker.groups("orders")
    assert (state.unsequenced, state.not_pumped, state.lag, state.oldest_unhandled) == (
        0, 0, 4, 1)


def test_the_unsequenced_count_stops_at_its_cap_and_says_there_are_more(monkeypatch) -> None:
    """Counting them all walked the whole pile at every stats call (millions after a long
    outage of every reader). Past the cap the count stays the cap, flagged: the lag is a
    floor, shown ``3+``, and the JSON keeps its fields (ints) and adds one."""
    from django_mysqlq.broker import topic_ops
    from tests.plan_support import costly

    monkeypatch.setattr(topic_ops, "UNSEQUENCED_COUNT_CAP", 3)
    billing = group("orders", "billing", start="latest")
    Topic("orders").publish_many([{"n": i} for i in range(3)])  # no worker sequences them
    [state] = broker.groups("orders")
    assert (state.unsequenced, state.unsequenced_capped, state.lag_shown) == (3, False, "3")
    time.sleep(0.05)
    Topic("orders").publish_many([{"n": i} for i in range(3, 5)])
    [state] = broker.groups("orders")
    assert (state.unsequenced, state.unsequenced_capped, state.lag, state.lag_shown) == (
        3, True, 3, "3+")
    assert state.oldest_age_seconds is not None and state.oldest_age_seconds >= 0.05
    [_, line] = run("groups", "--topic", "orders").splitlines()
    assert line.split()[:5] == ["orders", "billing", "0", "0", "3+"]
    [row] = json.loads(run("groups", "--json"))
    assert (row["lag"], row["unsequenced"], row["unsequenced_capped"]) == (3, 3, True)
    out = io.StringIO()
    call_command("queuestats", stdout=out)
    [line] = [text.split() for text in out.getvalue().splitlines()
              if text.split()[:2] == ["orders", "billing"]]
    assert line[:5] == ["orders", "billing", "0", "0", "3+"]
    out = io.StringIO()
    call_command("queuestats", "--json", stdout=out)
    [row] = json.loads(out.getvalue())["groups"]
    assert (row["lag"], row["unsequenced"], row["unsequenced_capped"]) == (3, 3, True)
    assert costly(topic_ops.UNSEQUENCED_COUNT_SQL, ["orders", 4]) == []  # reads 4 at most
    broker.sequence("orders")
    broker.pump(billing, batch=100, window=100)
    [state] = broker.groups("orders")
    assert (state.unsequenced, state.unsequenced_capped, state.lag_shown) == (0, False, "5")


def test_reset_to_offset_time_earliest_latest_records_who_and_cancels_waiting() -> None:
    made = group("orders", "billing")
    publish("orders", 5)
    broker.pump(made, batch=100, window=100)
    assert Message.objects.filter(queue=made.queue, status=MessageStatus.READY).count() == 5
    out = run("reset", "billing", "--topic", "orders", "--to-offset", "3")
    assert "position 5 -> 2" in out and "5 waiting deliveries cancelled" in out
    row = TopicGroup.objects.get(topic="orders", group_name="billing")
    assert row.position == 2 and row.changed_by.startswith("cli:") and row.changed_at
    assert not Message.objects.filter(queue=made.queue).exists()
    assert Attempt.objects.filter(task_name=made.task_name, outcome="cancelled",
                                  error_message="topic group reset").count() == 5
    # The next pump starts at offset 3: each offset after the position once.
    assert broker.pump(made, batch=100, window=100) == 3
    assert sorted(TopicDelivery.objects.filter(group_name="billing")
                  .values_list("offset", flat=True)) == [1, 2, 3, 3, 4, 4, 5, 5]
    run("reset", "billing", "--topic", "orders", "--latest")
    assert TopicGroup.objects.get(group_name="billing").position == 5
    run("reset", "billing", "--topic", "orders", "--earliest")
    assert TopicGroup.objects.get(group_name="billing").position == 0
    time.sleep(0.05)
    cut = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    publish("orders", 2, start=5)
    run("reset", "billing", "--topic", "orders", "--to-time", cut.isoformat())
    assert TopicGroup.objects.get(group_name="billing").position == 5
    future = (cut + dt.timedelta(days=1)).isoformat()
    run("reset", "billing", "--topic", "orders", "--to-time", future)
    assert TopicGroup.objects.get(group_name="billing").position == 7
    # A duration ago, as lookup --since takes: every message is younger than an hour.
    run("reset", "billing", "--topic", "orders", "--to-time", "1h")
    assert TopicGroup.objects.get(group_name="billing").position == 0


def test_reset_refuses_offsets_the_topic_does_not_keep_and_unknown_groups() -> None:
    group("orders", "billing")
    publish("orders", 10)
    forget_before("orders", 6)
    with pytest.raises(CommandError, match=r"no longer keeps offset 3.*earliest kept"):
        run("reset", "billing", "--topic", "orders", "--to-offset", "3")
    with pytest.raises(CommandError, match="has no offset 12 yet"):
        run("reset", "billing", "--topic", "orders", "--to-offset", "12")
    with pytest.raises(CommandError, match="no consumer group 'nobody'"):
        run("reset", "nobody", "--topic", "orders", "--latest")
    with pytest.raises(CommandError, match="ISO date"):
        run("reset", "billing", "--topic", "orders", "--to-time", "yesterday")
    assert TopicGroup.objects.get(group_name="billing").position == 0  # unchanged
    run("reset", "billing", "--topic", "orders", "--earliest")
    assert TopicGroup.objects.get(group_name="billing").position == 5
    run("reset", "billing", "--topic", "orders", "--to-offset", "11")
    assert TopicGroup.objects.get(group_name="billing").position == 10


def test_reset_leaves_a_running_delivery_alone() -> None:
    made = group("orders", "billing")
    publish("orders", 3)
    broker.pump(made, batch=100, window=100)
    [running] = claim(made, 1)
    out = run("reset", "billing", "--topic", "orders", "--earliest")
    assert "2 waiting deliveries cancelled" in out
    assert Message.objects.get(pk=running.id).status == MessageStatus.CLAIMED
    handle_ack = broker.ack  # the running one still acks normally
    from django_mysqlq.messages import AttemptResult
    from tests.operator_support import RUNNER
    handle_ack(running, RUNNER, AttemptResult(started_at=broker.database_now()))
    assert not Message.objects.filter(pk=running.id).exists()


def test_replay_makes_new_deliveries_for_one_group_linked_to_the_originals() -> None:
    billing = group("orders", "billing")
    audit = group("orders", "audit")
    publish("orders", 6, key="c1")
    broker.pump(billing, batch=100, window=100)
    broker.pump(audit, batch=100, window=100)
    handle(billing, 1)  # keyed: one at a time, in order
    out = run("replay", "--topic", "orders", "--group", "billing", "--from-offset", "1",
              "--to-offset", "1")
    assert "1 new deliveries" in out
    assert TopicGroup.objects.get(group_name="billing").position == 6  # unchanged
    assert TopicGroup.objects.get(group_name="billing").changed_by.startswith("cli:")
    links = TopicDelivery.objects.filter(group_name="billing", offset=1)
    assert links.count() == 2
    assert TopicDelivery.objects.filter(group_name="audit", offset=1).count() == 1
    replay_id = max(links.values_list("message_id", flat=True))
    # Same key: the replay waits behind the deliveries of c1 already waiting.
    assert Message.objects.get(pk=replay_id).status == MessageStatus.BLOCKED
    lookup = json.loads(run("lookup", "--topic", "orders", "--offset", "1", "--json"))
    [message] = lookup["messages"]
    groups = sorted((d["group"], d["replay"], d["outcome"]) for d in message["deliveries"])
    assert groups == [("audit", False, "ready"), ("billing", False, "succeeded"),
                      ("billing", True, "blocked")]


@pytest.mark.parametrize(("first", "last", "problem"), [
    ("4", "2", "range 4..2 is empty"),
    ("3", "9", "at offset 6 .* ends at 6 at most"),
    ("1", "200000", "at most 100,000 offsets"),
    ("2", "3", "no longer keeps offset 2"),
])
def test_replay_refuses_empty_undelivered_huge_or_deleted_ranges(first: str, last: str,
                                                                 problem: str) -> None:
    made = group("orders", "billing")
    publish("orders", 6)
    broker.pump(made, batch=100, window=100)
    forget_before("orders", 3)
    with pytest.raises(CommandError, match=problem):
        run("replay", "--topic", "orders", "--group", "billing", "--from-offset", first,
            "--to-offset", last)
    assert TopicDelivery.objects.count() == 6


def test_lookup_by_offset_key_and_time_with_the_trace() -> None:
    made = group("orders", "billing")
    publish("orders", 3, key="alice")
    publish("orders", 2, key="bob", start=3)
    broker.pump(made, batch=100, window=100)
    handle(made, 3)  # alice's first and bob's first (one per key), then alice's second
    out = run("lookup", "--topic", "orders", "--offset", "1")
    assert "orders@1 key='alice'" in out
    assert "billing: #" in out and "succeeded" in out and "test-host:1:abc" in out
    by_key = json.loads(run("lookup", "--topic", "orders", "--key", "bob", "--json"))
    assert [m["offset"] for m in by_key["messages"]] == [5, 4]  # newest first
    by_time = json.loads(run("lookup", "--topic", "orders", "--since", "1h", "--json"))
    assert [m["offset"] for m in by_time["messages"]] == [1, 2, 3, 4, 5]
    none = run("lookup", "--topic", "orders", "--since", "2000-01-01",
               "--until", "2000-01-02")
    assert "No message matches" in none
    with pytest.raises(CommandError, match="one"):
        run("lookup", "--topic", "orders", "--offset", "1", "--key", "bob")


def test_a_huge_lookup_range_is_bounded() -> None:
    group("orders", "billing")
    publish("orders", 30)
    out = json.loads(run("lookup", "--topic", "orders", "--since", "1d", "--limit", "10",
                         "--json"))
    assert len(out["messages"]) == 10 and out["truncated"] is True
    text = run("lookup", "--topic", "orders", "--since", "1d", "--limit", "10")
    assert "More messages match" in text
    with pytest.raises(CommandError, match="1 to 1000"):
        run("lookup", "--topic", "orders", "--since", "1d", "--limit", "100000")
    found = broker.lookup("orders", offset=1, to_offset=10**12, limit=5)
    assert len(found.messages) == 5 and found.truncated


def test_queuestats_lists_topics_by_volume_and_groups_with_lag() -> None:
    made = group("orders", "billing")
    group("rare", "r")
    publish("orders", 5)
    publish("rare", 1)
    broker.pump(made, batch=2, window=100)
    out = io.StringIO()
    call_command("queuestats", stdout=out)
    text = out.getvalue()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("topic "))
    end = lines.index("", start)  # the topics table, up to the groups'
    rows = [re.split(r"\s{2,}", line)[:6] for line in lines[start + 1:end]]
    assert rows == [["orders", "5", "5", "5", "5", "5"], ["rare", "1", "1", "1", "1", "1"]]
    assert "billing" in text
    out = io.StringIO()
    call_command("queuestats", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert [t["topic"] for t in data["topics"]] == ["orders", "rare"]
    billing = next(g for g in data["groups"] if g["group"] == "billing")
    assert (billing["position"], billing["lag"]) == (2, 5)
    assert data["overran"] == []


def test_a_delivery_is_past_its_timeout_from_its_start_not_its_claim() -> None:
    """A claim takes a batch: the deliveries waiting for a thread are not running. Timed
    from the claim, the fourth of a batch behind 10 s handlers with a 30 s timeout was
    shown as past it before it began."""
    made = group("orders", "slow", timeout=30)
    publish("orders", 3)
    broker.pump(made, batch=100, window=100)
    running, waiting, fresh = claim(made, 3)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_message SET claimed_at = UTC_TIMESTAMP(6) - INTERVAL "
                       "40 SECOND WHERE id IN (%s, %s, %s)", [running.id, waiting.id, fresh.id])
        cursor.execute("UPDATE mysqlq_message SET started_at = UTC_TIMESTAMP(6) - INTERVAL "
                       "35 SECOND WHERE id = %s", [running.id])  # started 5 s after its claim
        cursor.execute("UPDATE mysqlq_message SET started_at = UTC_TIMESTAMP(6) - INTERVAL "
                       "5 SECOND WHERE id = %s", [fresh.id])  # waited 35 s for a thread
    [overran] = broker.overran_deliveries()
    assert overran.message_id == running.id
    assert 35 <= overran.running_seconds < 45
    assert (overran.topic, overran.group, overran.offset) == ("orders", "slow", 1)


def test_a_reset_to_a_time_takes_every_message_published_since_in_any_commit_order(
        ) -> None:
    """Offsets follow commits; ``published_at`` is the insert. A message published after
    the time in a short transaction gets a lower offset than one published before it in a
    long one: a reset to the time must give the group both (taking the first message by
    time, and its offset - 1, skipped the other)."""
    group("orders", "billing")
    publish("orders", 2)  # offsets 1, 2: before the time
    time.sleep(0.05)
    cut = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    with open_publisher("orders", {"n": "long"}):  # inserted first, committed last
        time.sleep(0.05)
        publish("orders", 1, start=10)  # inserted later, committed and sequenced first
    broker.sequence("orders")
    offsets = dict(TopicMessage.objects.filter(topic="orders", offset__gt=2)
                   .values_list("payload", "offset"))
    assert offsets == {'{"n":10}': 3, '{"n":"long"}': 4}, offsets
    run("reset", "billing", "--topic", "orders", "--to-time", cut.isoformat())
    assert TopicGroup.objects.get(group_name="billing").position == 2


def test_a_reset_to_a_time_nothing_was_published_at_or_after_says_so() -> None:
    """``--to-time`` in the future (or past the last publish) finds no message: the group is
    set to the latest offset, as before, and the output says so instead of staying quiet."""
    made = group("orders", "billing")
    publish("orders", 3)
    broker.pump(made, batch=100, window=100)
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(microsecond=0)
    out = run("reset", "billing", "--topic", "orders", "--earliest")
    assert "No message was published" not in out
    out = run("reset", "billing", "--topic", "orders", "--to-time", future.isoformat())
    assert TopicGroup.objects.get(group_name="billing").position == 3
    assert (f"No message was published at or after {future.isoformat()} yet: the group is "
            "set to the latest offset 3; it gets what is published from now on.") in out
    out = run("reset", "billing", "--topic", "orders", "--to-time", "1h")
    assert "position 3 -> 0" in out and "No message was published" not in out


@pytest.mark.parametrize("option", ["--to-time", "--since", "--until"])
def test_a_duration_ago_with_a_dash_is_refused_saying_to_write_it_without(
        option: str) -> None:
    group("orders", "billing")
    publish("orders", 2)
    action = (["reset", "billing", "--topic", "orders"] if option == "--to-time"
              else ["lookup", "--topic", "orders"])
    with pytest.raises(CommandError, match=f"{option} 2h, not {option} -2h"):
        run(*action, option, "-2h")
    with pytest.raises(CommandError, match="without a dash: write 2h, not -2h"):
        run(*action, f"{option}=-2h")
    with pytest.raises(CommandError, match="expected one argument"):  # not a duration
        run(*action, option, "--json")
    assert TopicGroup.objects.get(group_name="billing").position == 0


def test_offsets_before_1_are_refused_saying_offsets_start_at_1() -> None:
    made = group("orders", "billing")
    publish("orders", 10)
    broker.pump(made, batch=100, window=100)
    for offset in ("0", "-5"):
        with pytest.raises(CommandError) as refused:
            run("reset", "billing", "--topic", "orders", "--to-offset", offset)
        said = str(refused.value)
        assert f"has no offset {offset}: offsets start at 1. Reset to --earliest" in said
        assert "retention" not in said
    with pytest.raises(CommandError) as refused:
        run("replay", "--topic", "orders", "--group", "billing", "--from-offset", "0",
            "--to-offset", "2")
    assert "has no offset 0: offsets start at 1. Replay from 1." in str(refused.value)
    assert "retention" not in str(refused.value)
    forget_before("orders", 6)  # retention deleted 1-5: named, with the first kept
    with pytest.raises(CommandError, match=r"has no offset -5: offsets start at 1, and "
                       r"retention deleted the messages before offset 6 \(the earliest "
                       r"kept\)\. Reset to --earliest, or to an offset from 6 to 11"):
        run("reset", "billing", "--topic", "orders", "--to-offset", "-5")
    with pytest.raises(CommandError, match=r"has no offset 0: offsets start at 1, and "
                       "retention deleted the messages before offset 6. Replay from 6."):
        run("replay", "--topic", "orders", "--group", "billing", "--from-offset", "0",
            "--to-offset", "8")
    assert TopicGroup.objects.get(group_name="billing").position == 10


def test_nothing_kept_means_nothing_to_replay() -> None:
    made = group("orders", "billing")
    publish("orders", 6)
    broker.pump(made, batch=100, window=100)
    forget_before("orders", 7)  # retention deleted every message: first_offset 7, last 6
    for first in ("0", "3", "7"):
        with pytest.raises(CommandError) as refused:
            run("replay", "--topic", "orders", "--group", "billing", "--from-offset", first,
                "--to-offset", "6" if first != "7" else "7")
        said = str(refused.value)
        assert ("keeps no message (retention deleted offsets 1 to 6): there is nothing to "
                "replay") in said
        assert "Replay from" not in said
    with pytest.raises(CommandError, match=r"no longer keeps offset 3: retention deleted the "
                       r"messages before offset 7 \(none is kept\)\. Reset to offset 7 "
                       r"\(only new messages\)\."):
        run("reset", "billing", "--topic", "orders", "--to-offset", "3")


def test_groups_of_a_topic_without_groups_or_unknown_name_it() -> None:
    group("orders", "billing")
    publish("quiet", 1)  # a topic with messages but no group
    assert run("groups", "--topic", "nosuch").strip() == (
        "No topic 'nosuch' is known: no message of it has an offset and no consumer group "
        "reads it.")
    assert run("groups", "--topic", "quiet").strip().startswith(
        "Topic 'quiet' has no consumer groups yet")
    assert "billing" in run("groups", "--topic", "orders")


def test_lookup_counts_attempts_run_not_operator_actions() -> None:
    """"(N attempts)" counted every history row: a requeue, a cancel by a reset were
    attempts too. Now the runs only, with the operator's actions named apart."""
    made = group("orders", "billing")
    publish("orders", 2)
    broker.pump(made, batch=100, window=100)
    [dead] = handle(made, 1, fail=True)  # offset 1: failed for good
    assert broker.requeue([dead], OPERATOR) == [dead]
    handle(made, 2)  # offset 2, then offset 1 again: both succeed
    publish("orders", 1, start=2)
    broker.pump(made, batch=100, window=100)
    run("reset", "billing", "--topic", "orders", "--latest")  # cancels offset 3's delivery
    text = run("lookup", "--topic", "orders", "--offset", "1")
    assert "succeeded" in text and "(2 attempts; requeued by test:alice)" in text
    assert "(1 attempt)" in run("lookup", "--topic", "orders", "--offset", "2")
    text = run("lookup", "--topic", "orders", "--offset", "3")
    assert "cancelled" in text and "(0 attempts; cancelled by cli:" in text
    [message] = json.loads(run("lookup", "--topic", "orders", "--offset", "1",
                               "--json"))["messages"]
    [delivery] = message["deliveries"]
    assert delivery["attempts"] == 2
    assert [(a["action"], a["by"]) for a in delivery["operator_actions"]] == [
        ("requeued", "test:alice")]
    [message] = json.loads(run("lookup", "--topic", "orders", "--offset", "3",
                               "--json"))["messages"]
    [delivery] = message["deliveries"]
    assert (delivery["outcome"], delivery["attempts"]) == ("cancelled", 0)
    assert [(a["action"], a["note"]) for a in delivery["operator_actions"]] == [
        ("cancelled", "topic group reset")]


def test_lookup_shows_a_failed_deliverys_error_and_when_a_retry_runs_next() -> None:
    """The trace said ``scheduled at <its last run>`` with neither the error nor the time
    of the next try, and a dead delivery without its error."""
    from django_mysqlq.messages import AttemptResult
    from tests.operator_support import RUNNER

    billing = group("orders", "billing")
    publish("orders", 2)
    broker.pump(billing, batch=10, window=100)
    first, second = claim(billing, 2)
    failure = AttemptResult(started_at=broker.database_now(), error_class="RuntimeError",
                            error_message="card declined", traceback="...")
    broker.fail(first, RUNNER, failure, retry=True, retry_in=600)
    broker.fail(second, RUNNER, failure, retry=False)
    text = run("lookup", "--topic", "orders", "--since", "1h")
    scheduled, dead = (line for line in text.splitlines() if line.startswith("  billing"))
    assert ", next try at " in scheduled and scheduled.endswith(
        "; last error: RuntimeError: card declined"), scheduled
    assert " dead at " in dead and dead.endswith("; last error: RuntimeError: card declined")
    data = json.loads(run("lookup", "--topic", "orders", "--since", "1h",
                          "--json"))
    one, two = (m["deliveries"][0] for m in data["messages"])
    assert one["outcome"] == "scheduled" and one["error"] == "RuntimeError: card declined"
    next_try = dt.datetime.fromisoformat(one["next_try_at"])
    assert 500 < (next_try - dt.datetime.now(dt.UTC)).total_seconds() < 700
    assert (two["outcome"], two["error"], two["next_try_at"]) == (
        "dead", "RuntimeError: card declined", None)


def test_lookup_names_a_group_past_an_offset_with_no_delivery_of_it_on_record() -> None:
    """Before, a group whose link row was gone was left out of the trace: the message
    looked as if that group never got it."""
    billing = group("orders", "billing")
    publish("orders", 3)
    group("orders", "late", start="latest")  # made after offsets 1-3 were given out
    broker.pump(billing, batch=100, window=100)
    handle(billing, 3)
    publish("orders", 1, start=3)  # offset 4: no group is past it yet
    TopicDelivery.objects.filter(group_name="billing", offset=2).delete()  # by hand
    out = run("lookup", "--topic", "orders", "--offset", "2")
    assert "  billing: no delivery record (its link row is missing)\n" in out
    assert "  late: never delivered: the group started after it (start latest)\n" in out
    one = run("lookup", "--topic", "orders", "--offset", "1")
    assert "billing: #" in one and "no delivery record" not in one
    assert "billing" not in run("lookup", "--topic", "orders", "--offset", "4")
    [message] = json.loads(run("lookup", "--topic", "orders", "--offset", "2",
                                "--json"))["messages"]
    assert message["deliveries"] == []
    assert [(n["group"], n["reason"]) for n in message["no_delivery"]] == [
        ("billing", "no delivery record (its link row is missing)"),
        ("late", "never delivered: the group started after it (start latest)")]
    # A reset that moves nothing forward (billing is at 3) skips nothing.
    broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=4), OPERATOR)
    assert "  billing: no delivery record (its link row is missing)\n" in run(
        "lookup", "--topic", "orders", "--offset", "2")
    # Moved forward by an operator after offset 2 was given: a reset may have skipped it.
    broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=5), OPERATOR)
    moved = run("lookup", "--topic", "orders", "--offset", "2")
    assert (f"  billing: no delivery record: its position was moved past it by "
            f"{OPERATOR.name}") in moved and "or its link row is missing" in moved


def test_a_lookup_that_can_match_nothing_is_refused_saying_why() -> None:
    publish("orders", 2)
    with pytest.raises(CommandError, match=r"--until \(.*\) is before --since"):
        run("lookup", "--topic", "orders", "--since", "1h", "--until", "2h")
    for offset in ("0", "-5"):
        with pytest.raises(CommandError, match="--offset must be 1 or more"):
            run("lookup", "--topic", "orders", "--offset", offset)
    # The same span the right way round finds both.
    found = run("lookup", "--topic", "orders", "--since", "2h", "--until", "0s")
    assert [line.split()[0] for line in found.splitlines()] == ["orders@1", "orders@2"]


def test_a_reset_whose_cancel_fails_is_rolled_back_and_says_to_run_it_again(
        monkeypatch) -> None:
    """The waiting deliveries are cancelled in the reset's own transaction: a failed
    cancel (a lock wait) rolls the position's move back with it, and the operator is told
    so instead of a bare database error. (It used to commit the move first: a failed
    cancel left the position moved and the deliveries to run.)"""
    from django.db import OperationalError

    from django_mysqlq.broker import topic_reset

    made = group("orders", "billing")
    publish("orders", 4)
    broker.pump(made, batch=100, window=100)

    def locked(*args: object, **kwargs: object) -> list[int]:
        raise OperationalError(1205, "Lock wait timeout exceeded")

    monkeypatch.setattr(topic_reset, "cancel_within", locked)
    with pytest.raises(CommandError, match=r"'billing' of topic 'orders' was not reset: its "
                                           r"4 waiting deliveries could not be cancelled .*"
                                           r"Run the same reset again\. If it fails again, "
                                           r"another transaction holds .* SHOW ENGINE INNODB "
                                           r"STATUS .* stop the group's workers"):
        run("reset", "billing", "--topic", "orders", "--to-offset", "2")
    assert TopicGroup.objects.get(group_name="billing").position == 4
    assert Message.objects.filter(queue=made.queue, status=MessageStatus.READY).count() == 4
    monkeypatch.undo()
    out = run("reset", "billing", "--topic", "orders", "--to-offset", "2")
    assert "position 4 -> 1" in out and "4 waiting deliveries cancelled" in out


def test_a_replay_the_server_refuses_says_why_instead_of_a_traceback() -> None:
    """A key stored by hand past what publish allows: its delivery's ordered subject
    (``<topic>:<key>``) is longer than the gate key column, and the replay's insert
    failed with a bare DataError."""
    made = group("orders", "billing")
    publish("orders", 1)
    broker.pump(made, batch=100, window=100)  # delivered: a replay may take it
    TopicMessage.objects.filter(topic="orders", offset=1).update(key="k" * 255)
    with pytest.raises(CommandError, match=r"Offsets 1\.\.1 of topic 'orders' could not be "
                                           r"replayed into group 'billing'"):
        run("replay", "--topic", "orders", "--group", "billing", "--from-offset", "1",
            "--to-offset", "1")


def _refused_replay(first: str, last: str) -> tuple[str, int]:
    """Replay ``first..last`` of orders into billing, which the command refuses: its error,
    and the deliveries billing got all the same (the chunks committed before it)."""
    before = TopicDelivery.objects.filter(group_name="billing").count()
    with pytest.raises(CommandError) as caught:
        run("replay", "--topic", "orders", "--group", "billing", "--from-offset", first,
            "--to-offset", last)
    return str(caught.value), TopicDelivery.objects.filter(group_name="billing").count() - before


def test_a_replay_that_fails_part_way_says_what_was_committed_and_where_to_resume(
        monkeypatch) -> None:
    """Chunks commit one by one: a failure in a later one must not read as "nothing was
    replayed" (the operator replayed the range again, delivering the first part twice)."""
    from django_mysqlq.broker import topic_replay

    monkeypatch.setattr(topic_replay, "REPLAY_CHUNK", 2)
    made = group("orders", "billing")
    publish("orders", 5)
    broker.pump(made, batch=100, window=100)
    TopicMessage.objects.filter(topic="orders", offset=4).update(key="k" * 255)
    said, made_now = _refused_replay("1", "5")
    assert "stopped at offset 3" in said and "(2 deliveries, committed" in said, said
    assert "replay from offset 3 to 5" in said, said
    assert made_now == 2


def test_a_replay_stops_before_a_message_too_big_for_one_statement(monkeypatch) -> None:
    from django_mysqlq.broker import topic_replay

    made = group("orders", "billing")
    Topic("orders").publish_many([{"n": 1}, {"blob": "x" * 5000}, {"n": 3}])
    broker.sequence("orders")
    broker.pump(made, batch=100, window=100)
    monkeypatch.setattr(topic_replay, "row_room", lambda alias: 2000)
    said, made_now = _refused_replay("1", "3")
    assert "stopped at offset 2" in said and "max_allowed_packet" in said, said
    assert "(1 deliveries, committed" in said and "replay from offset 3 to 3" in said, said
    assert made_now == 1
