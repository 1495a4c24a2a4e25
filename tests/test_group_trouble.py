"""A member's groups whose pump fails: the pause between tries, the note on the group's
row, and what stays the worker loop's. (With a real worker:
tests/test_topic_wedged_worker.py.)"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from django.db import OperationalError

from django_mysqlq import Topic, broker
from django_mysqlq.broker import topic_problems
from django_mysqlq.models import TopicGroup
from django_mysqlq.signals import topic_group_stopped
from django_mysqlq.topicnames import delivery_task_name, group_queue
from django_mysqlq.worker.group_trouble import GroupTrouble
from tests.conftest import held_by_stranger

pytestmark = pytest.mark.django_db(transaction=True)

OUT_OF_RANGE = OperationalError(1264, "Out of range value for column 'last_offset' at row 1")


def spec(topic: str, group: str) -> broker.GroupSpec:
    return broker.GroupSpec(topic=topic, group=group, queue=group_queue(group),
                            task_name=delivery_task_name(topic, group), on_dead="skip",
                            max_attempts=3, retry_backoff=0.1, timeout=None, start="earliest")


@pytest.fixture
def ops() -> broker.GroupSpec:
    Topic("opsfeed").publish("a")
    broker.sequence("opsfeed")
    found = spec("opsfeed", "ops")
    broker.create_group(found)
    return found


def test_a_failing_pump_rests_longer_at_each_failure_up_to_the_longest_pause(ops) -> None:
    trouble = GroupTrouble()
    pauses = []
    for _ in range(6):
        before = time.monotonic()
        assert trouble.failed(ops, OUT_OF_RANGE)
        assert trouble.resting(ops, before)
        pauses.append(trouble._next_try[("opsfeed", "ops")] - before)
    expected = [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert [round(p, 1) for p in pauses] == expected
    assert trouble.wedged(ops) and trouble.waits_for_operator(ops)
    # A pump that ran without error ends the pause; one that made nothing does not say
    # the group works again (its broken row may just have had nothing to stamp).
    trouble.pumped(ops, broker.Pumped(0, False))
    assert not trouble.resting(ops, time.monotonic())
    assert trouble.wedged(ops)
    trouble.pumped(ops, broker.Pumped(1, False))
    assert not trouble.wedged(ops)


def test_a_lock_given_up_on_is_tried_at_the_next_round_and_wedges_nothing(ops) -> None:
    trouble = GroupTrouble()
    assert trouble.failed(ops, OperationalError(1205, "Lock wait timeout exceeded"))
    assert not trouble.resting(ops, time.monotonic())
    assert not trouble.wedged(ops)
    assert broker.groups("opsfeed", "ops")[0].pump_problem.startswith("its pump failed")


@pytest.mark.parametrize("error", [
    OperationalError(1146, "Table 'mysqlq_topic' doesn't exist"),
    OperationalError(1053, "Server shutdown in progress"),  # its session still pings
])
def test_what_the_loop_handles_is_left_to_it(ops, error) -> None:
    """A missing table, or the server going away: the loop's outage handling, and no
    pause for the group after it (it would delay the group past the server's return)."""
    trouble = GroupTrouble()
    assert not trouble.failed(ops, error)
    assert not trouble.resting(ops, time.monotonic())
    assert broker.groups("opsfeed", "ops")[0].pump_problem == ""


def test_the_note_is_written_once_per_kind_and_keeps_when_it_was_first_seen(ops, caplog) -> None:
    trouble = GroupTrouble()
    sent: list[dict[str, Any]] = []

    def receiver(sender: str, **kwargs: Any) -> None:
        sent.append({"sender": sender, "group": kwargs["group"], "problem": kwargs["problem"]})

    topic_group_stopped.connect(receiver)
    try:
        with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
            for _ in range(3):
                trouble.failed(ops, OUT_OF_RANGE)
    finally:
        topic_group_stopped.disconnect(receiver)
    assert [(s["sender"], s["group"]) for s in sent] == [("opsfeed", "ops")]  # once
    assert [r.getMessage()[:44] for r in caplog.records] == [
        "Group 'ops' of topic 'opsfeed': its pump fai"]
    [state] = broker.groups("opsfeed", "ops")
    assert state.pump_problem == ("its pump failed: (1264, \"Out of range value for column "
                                  "'last_offset' at row 1\")")
    assert sent[0]["problem"] == state.pump_problem
    first_seen = state.pump_problem_at
    assert first_seen is not None
    # Another member saying the same keeps the time it was first seen.
    time.sleep(0.01)
    GroupTrouble().failed(ops, OUT_OF_RANGE)
    assert broker.groups("opsfeed", "ops")[0].pump_problem_at == first_seen
    # An operator's reset clears it (as does the pump's next move of the position).
    broker.reset_group("opsfeed", "ops", broker.ResetTarget(edge="earliest"),
                       broker.Operator("test"))
    assert broker.groups("opsfeed", "ops")[0].pump_problem == ""


def test_a_group_row_held_by_a_stranger_is_not_waited_for(ops, caplog) -> None:
    with held_by_stranger("SELECT id FROM mysqlq_topic_group WHERE group_name = 'ops'"
                          " FOR UPDATE"):
        started = time.monotonic()
        assert not broker.note_pump_problem("opsfeed", "ops", "its pump failed: x")
        assert time.monotonic() - started < 1.0  # (innodb_lock_wait_timeout is 50 s)
    assert broker.note_pump_problem("opsfeed", "ops", "x" * 3000)
    assert len(TopicGroup.objects.get(group_name="ops").pump_problem) \
        == topic_problems.PROBLEM_MAX_CHARS


def test_an_error_no_database_raised_rests_its_group_and_leaks_no_room(monkeypatch,
                                                                       caplog) -> None:
    """A row changed by hand into a value the pump can't take raised, say, an
    AttributeError: no `except DatabaseError` caught it, and it ended the worker. And a
    resting group's round reserved its member's room (``--max-tasks`` budget) and never
    gave it back: a worker with a failing group soon said it had reached --max-tasks."""
    import threading

    from django_mysqlq.conf import get_settings
    from django_mysqlq.worker.topics import TopicDuty
    from tests.testapp import topic_ops_handlers  # noqa: F401 (the 'ops' subscription)

    duty = TopicDuty(["group:ops"], threading.Event(), get_settings())
    assert [s.group for s in duty.specs] == ["ops"]

    class Claimer:
        id = "w-test"
        reserved = 0

        def pump_room(self, queue: str) -> int:
            self.reserved += 4
            return 4

        def pump_took(self, messages: list[Any], reserved: int) -> None:
            self.reserved -= reserved - len(messages)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'NoneType' object has no attribute 'tzinfo'")

    claimer = Claimer()
    monkeypatch.setattr(broker, "pump_claiming", broken)
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        assert duty.pump(force=True, claimer=claimer) == 0  # raised nothing
    assert "its pump failed: AttributeError: 'NoneType' object" in caplog.text
    assert claimer.reserved == 0
    for _ in range(5):  # resting: its rounds reserve nothing
        duty.pump(force=True, claimer=claimer)
    assert claimer.reserved == 0
    assert duty.trouble.wedged(duty.specs[0])
