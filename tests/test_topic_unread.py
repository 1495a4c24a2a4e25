"""Topics nobody reads: only a worker that reads a topic (a member of one of its groups,
a broadcast subscriber) gives its messages offsets, so with no such worker running the
messages had no offset and no topic row, and retention, lookups and statistics (all by
offset) never saw them: kept forever, invisible. The recovery leader now sequences them
(``broker.sequence_unread``, the housekeeping step "sequencing of unread topics")."""

from __future__ import annotations

import datetime as dt
import io
import time

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings

from django_mysqlq import Topic, broker
from django_mysqlq.models import TopicMessage, TopicState
from django_mysqlq.worker import topic_retention
from tests.conftest import wait_for
from tests.topic_ops_support import open_publisher

pytestmark = pytest.mark.django_db(transaction=True)


def offsets(topic: str) -> list[tuple[int, int | None]]:
    return list(TopicMessage.objects.filter(topic=topic).order_by("id")
                .values_list("id", "offset"))


def test_the_leader_gives_offsets_to_a_topic_nobody_reads_and_retention_sees_them() -> None:
    Topic("unread").publish_many([{"n": n} for n in range(5)])
    Topic("unread").publish({"n": 5}, key="k")
    assert not TopicState.objects.filter(name="unread").exists()
    assert topic_retention.sequence_unread() == {"unread": 6}
    # Offsets in id order (publish order), 1 … 6, and the topic's row made.
    assert [offset for _, offset in offsets("unread")] == [1, 2, 3, 4, 5, 6]
    assert TopicState.objects.get(name="unread").last_offset == 6
    assert topic_retention.sequence_unread() == {}  # nothing left to stamp
    # Visible to lookups now.
    out = io.StringIO()
    call_command("queuetopic", "lookup", "--topic", "unread", "--offset", "6", stdout=out)
    assert out.getvalue().startswith("unread@6 key='k'")
    # And retention deletes them once old (no group waits for them).
    TopicMessage.objects.filter(topic="unread").update(
        published_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=2))
    with override_settings(MYSQLQ={"TOPIC_RETENTION_SECONDS": 86400}):
        assert topic_retention.prune() == {"unread": 6}
    assert not TopicMessage.objects.filter(topic="unread").exists()


def test_an_open_publisher_is_not_stamped_and_a_busy_reader_is_not_waited_for() -> None:
    Topic("busy").publish({"n": 0})
    broker.sequence("busy")  # the topic's row exists
    Topic("busy").publish({"n": 1})
    with open_publisher("busy", {"n": "open"}):
        # A reader's round holds the topic's row: the leader leaves the topic to it.
        holder = connections.create_connection("default")
        try:
            with holder.cursor() as cursor:
                cursor.execute("START TRANSACTION")
                cursor.execute("SELECT last_offset FROM mysqlq_topic WHERE name = 'busy' "
                               "FOR UPDATE")
                began = time.monotonic()
                assert broker.sequence_unread(5) == {}
                assert time.monotonic() - began < 2.0
                cursor.execute("ROLLBACK")
        finally:
            holder.close()
        # Free again: the committed message is stamped, the open transaction's is not
        # (it is not visible here either).
        assert broker.sequence_unread(5) == {"busy": 1}
        assert [offset for _, offset in offsets("busy")] == [1, 2]
    assert broker.sequence_unread(5) == {"busy": 1}
    assert [offset for _, offset in offsets("busy")] == [1, 2, 3]


def test_a_backlog_is_stamped_a_bounded_number_of_rounds_per_call() -> None:
    Topic("big").publish_many([{"n": n} for n in range(2500)])
    assert broker.sequence_unread(2) == {"big": 2000}  # two rounds of 1,000
    assert broker.sequence_unread(2) == {"big": 500}
    assert TopicState.objects.get(name="big").last_offset == 2500


def test_topics_take_turns_and_the_budget_bounds_later_rounds() -> None:
    Topic("turn-a").publish_many([{"n": n} for n in range(2500)])
    Topic("turn-b").publish_many([{"n": n} for n in range(1500)])
    # No time left after the first round of each: one round each, none starved.
    assert broker.sequence_unread(10, budget_seconds=0) == {"turn-a": 1000, "turn-b": 1000}
    assert broker.sequence_unread(10, budget_seconds=30) == {"turn-a": 1500, "turn-b": 500}
    assert broker.sequence_unread(10, budget_seconds=30) == {}
    assert [TopicState.objects.get(name=name).last_offset for name in ("turn-a", "turn-b")] \
        == [2500, 1500]


@pytest.mark.worker
@pytest.mark.parametrize("isolation", ["", "repeatable read"])
def test_a_running_leader_sequences_a_topic_no_worker_reads(start_worker, isolation) -> None:
    """Also at a site whose connections run REPEATABLE READ (the worker's own level)."""
    env = {"MYSQLQ_TEST_LEASE": "2"}
    if isolation:
        env["MYSQLQ_TEST_ISOLATION"] = isolation
    worker = start_worker("--queues", "default", env=env)
    wait_for(lambda: "started: queues=" in worker.output(), timeout=30,
             message="the worker to start")
    Topic("nobody-reads").publish_many([{"n": n} for n in range(3)])
    wait_for(lambda: [offset for _, offset in offsets("nobody-reads")] == [1, 2, 3],
             timeout=20, message="the leader to give the unread topic's messages offsets")
    # Later messages too (a REPEATABLE READ snapshot kept from an earlier round would
    # not see them).
    time.sleep(2.5)
    Topic("nobody-reads").publish_many([{"n": n} for n in range(3, 5)])
    wait_for(lambda: [offset for _, offset in offsets("nobody-reads")] == [1, 2, 3, 4, 5],
             timeout=20, message="the leader to sequence the later messages too")
    wait_for(lambda: "Gave offsets to 2 message(s) of topic 'nobody-reads'" in worker.output(),
             timeout=10, message="the log line")
    connection.close()


def test_finding_unread_topics_is_two_index_dives_per_topic() -> None:
    from django_mysqlq.broker.topics import (
        ANY_UNSEQUENCED_SQL,
        NEXT_TOPIC_SQL,
        UNSEQUENCED_IN_INDEX_ORDER_SQL,
    )
    from tests.plan_support import costly

    for name in ("a", "b", "c"):
        Topic(f"dive-{name}").publish_many([{"n": n} for n in range(300)])
    broker.sequence("dive-a")
    assert costly(NEXT_TOPIC_SQL, ["dive-a"]) == []
    assert costly(ANY_UNSEQUENCED_SQL, ["dive-b"]) == []
    assert costly(UNSEQUENCED_IN_INDEX_ORDER_SQL, ["dive-b", 1000]) == []
