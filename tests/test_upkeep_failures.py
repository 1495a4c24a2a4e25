"""A housekeeping step that fails on its own must not end the rest of the upkeep.

A topic row changed by hand (its ``last_offset`` at BIGINT's largest value, so giving its
next message an offset fails on the server: 1264, out of range) made the recovery
leader's step "sequencing of unread topics" raise at every round: the topics after it
got no offsets, the round ended there (topic retention and the repairs after it never
ran), and the control loop's whole upkeep failed with it on every pass ("Database error
in the worker loop … retrying", several times a second). Now the topic is left alone
(the other topics are sequenced), and any step's own failure is logged once and the
round goes on; a lost connection or a missing table still ends it.
"""

from __future__ import annotations

import logging
import threading

import pytest
from django.db import DatabaseError, connection

from django_mysqlq import Topic, broker
from django_mysqlq.models import TopicMessage, TopicState
from django_mysqlq.worker import topic_retention
from django_mysqlq.worker.upkeep import Housekeeping
from tests.conftest import raw_connection, wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True)]

#: A topic row's last_offset set by hand to BIGINT's largest value.
WEDGED = 2**63 - 1
#: A statement the server refuses on its own (1690, BIGINT out of range).
OVERFLOW_SQL = "SELECT 9223372036854775807 + 1"


def _overflow() -> None:
    with connection.cursor() as cursor:
        cursor.execute(OVERFLOW_SQL)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


def _wedge(topic: str) -> None:
    """A topic whose next message can't be given an offset, with one waiting."""
    Topic(topic).publish({"n": 0})
    broker.sequence(topic)
    TopicState.objects.filter(name=topic).update(last_offset=WEDGED)
    Topic(topic).publish({"n": 1})


def test_a_failing_step_is_said_once_and_the_next_steps_run(caplog) -> None:
    housekeeping = Housekeeping("w1", 5)
    with caplog.at_level(logging.INFO, logger="django_mysqlq"):
        assert housekeeping.step("overflow", "t", _overflow) is None
        assert housekeeping.step("next", "t", lambda: 7) == 7
        assert housekeeping.step("overflow", "t", _overflow) is None
    errors = _errors(caplog)
    assert len(errors) == 1, errors
    assert errors[0].startswith("Worker w1: upkeep step 'overflow' failed: (1690")
    assert "The round's other steps go on" in errors[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="django_mysqlq"):
        assert housekeeping.step("overflow", "t", lambda: "fine") == "fine"
    assert [r.getMessage() for r in caplog.records] == [
        "Worker w1: upkeep step 'overflow' works again."]


def test_a_step_cut_short_by_a_wake_up_is_no_error(caplog) -> None:
    """A producer's wake-up (``KILL QUERY``) that lands while a step runs: the step's
    statement fails with 1317 and runs again next round; nothing is said as an error."""
    Ledger.objects.create(label="held", pid=0)
    own = _own_connection_id()
    holder = raw_connection()
    try:
        holder.cursor().execute("START TRANSACTION")
        holder.cursor().execute("SELECT id FROM testapp_ledger FOR UPDATE")
        timer = threading.Timer(0.5, lambda: _kill(own, "KILL QUERY"))
        timer.start()

        def waits_for_the_row() -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT id FROM testapp_ledger FOR UPDATE")

        housekeeping = Housekeeping("w1", 5)
        with caplog.at_level(logging.INFO, logger="django_mysqlq"):
            assert housekeeping.step("promotion", "t", waits_for_the_row) is None
            timer.join()
            assert housekeeping.step("promotion", "t", lambda: 1) == 1
    finally:
        holder.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


def _own_connection_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


def _kill(connection_id: int, statement: str = "KILL") -> None:
    """``KILL`` (or ``KILL QUERY``) a session, from a connection of its own."""
    killer = raw_connection()
    try:
        killer.cursor().execute(f"{statement} {int(connection_id)}")
    finally:
        killer.close()


def test_a_lost_connection_or_a_missing_table_still_ends_the_round() -> None:
    housekeeping = Housekeeping("w1", 5)
    with pytest.raises(DatabaseError):  # 1146: every later step would fail the same way
        housekeeping.step("schema", "t", lambda: connection.cursor().execute(
            "SELECT 1 FROM mysqlq_no_such_table"))
    _kill(_own_connection_id())

    def on_a_dead_connection() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    with pytest.raises(DatabaseError):
        housekeeping.step("gone", "t", on_a_dead_connection)
    connection.close()


def test_a_topic_that_cannot_be_sequenced_holds_back_none_of_the_others(caplog) -> None:
    _wedge("wedged")
    Topic("fine").publish_many([{"n": n} for n in range(3)])
    with caplog.at_level(logging.INFO, logger="django_mysqlq"):
        assert topic_retention.sequence_unread() == {"fine": 3}
        assert topic_retention.sequence_unread() == {}
    errors = _errors(caplog)
    assert len(errors) == 1, errors  # once, not at every upkeep
    assert errors[0].startswith(
        "The recovery leader could not give offsets to messages of topic 'wedged' ")
    assert "Out of range" in errors[0] or "out of range" in errors[0], errors[0]
    # Put back: its message gets the next offset, and that is said.
    TopicState.objects.filter(name="wedged").update(last_offset=1)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="django_mysqlq"):
        assert topic_retention.sequence_unread() == {"wedged": 1}
    assert "Topic 'wedged' is sequenced again by the recovery leader." in [
        r.getMessage() for r in caplog.records]
    assert sorted(TopicMessage.objects.filter(topic="wedged")
                  .values_list("offset", flat=True)) == [1, 2]


@pytest.mark.worker
def test_a_leader_with_a_wedged_topic_keeps_promoting_and_sequencing_the_rest(
        start_worker) -> None:
    _wedge("wedged-unread")
    Topic("zz-unread-beside").publish({"n": 0})
    worker = start_worker("--queues", "default", env={"MYSQLQ_TEST_LEASE": "4"})
    tasks.record.using(delay=1.0).enqueue("delayed")
    wait_for(lambda: Ledger.objects.filter(label="delayed").exists(), timeout=30,
             message="the delayed task to be promoted and run")
    wait_for(lambda: TopicMessage.objects.filter(topic="zz-unread-beside",
                                                 offset__isnull=False).exists(),
             timeout=30, message="the other unread topic to be sequenced")
    tasks.record.using(delay=1.0).enqueue("delayed-later")  # past a few more rounds
    wait_for(lambda: Ledger.objects.filter(label="delayed-later").exists(), timeout=30,
             message="a later delayed task to be promoted and run")
    output = worker.output()
    assert "Database error in the worker loop" not in output, output[-2000:]
    assert output.count("could not give offsets to messages of topic 'wedged-unread'") == 1
    assert TopicMessage.objects.filter(topic="wedged-unread", offset__isnull=True).count() == 1
