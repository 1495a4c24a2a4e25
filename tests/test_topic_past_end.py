"""A group whose position is past its topic's last offset (an UPDATE by hand): the next
messages published get the offsets between, and the group must get each of them once.

Before, the pump only waited while the topic was below the position: once any reader
(another group's member, a broadcast reader, the leader) gave offsets past it, the group
went on after its position and the messages between, all published after it was set,
never reached it; a woken member's pump skipped them at once. queuestats, the dashboard
and the admin showed its lag as 0, and the "pump can't go on" note came only from a
member that had looked. (With a worker process: tests/test_topic_wedged_worker.py.)
"""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.urls import reverse

from django_mysqlq import Topic, broker
from django_mysqlq.models import TopicDelivery, TopicGroup, TopicState
from tests.conftest import held_by_stranger
from tests.operator_support import RUNNER
from tests.topic_ops_support import group, handle, publish

pytestmark = pytest.mark.django_db(transaction=True)


def offsets(topic: str) -> list[int]:
    return sorted(TopicDelivery.objects.filter(topic=topic).values_list("offset", flat=True))


def past_end(topic: str, at: int) -> broker.GroupSpec:
    """Group ``billing`` of ``topic`` with offsets 1 and 2 handled, then its position set
    to ``at`` by hand."""
    billing = group(topic, "billing")
    publish(topic, 2)
    assert broker.pump(billing, batch=10, window=100) == 2
    handle(billing, 2)
    TopicGroup.objects.filter(topic=topic).update(position=at)
    return billing


def pump_all(billing: broker.GroupSpec, **kwargs: object) -> None:
    for _ in range(10):
        pumped = broker.pump_group(billing, batch=100, window=100, sequence=True,
                                   **kwargs)  # type: ignore[arg-type]
        if not (pumped.made or pumped.behind):
            return


def test_offsets_given_after_a_position_past_the_end_all_reach_the_group(caplog) -> None:
    billing = past_end("pastend", 10)
    Topic("pastend").publish_many([{"n": n} for n in range(12)])
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        broker.sequence("pastend")  # another reader (a member of another group, say)
    assert broker.last_offset("pastend") == 14
    [said] = [r.getMessage() for r in caplog.records if "was at position" in r.getMessage()]
    assert said.startswith("Group 'billing' of topic 'pastend' was at position 10, past the "
                           "topic's last offset 2 (changed by hand?): the next messages "
                           "published get offsets 3 to 10")
    assert "Its position is set back to 2" in said
    assert broker.position("pastend", "billing") == 2
    pump_all(billing)
    assert offsets("pastend") == list(range(1, 15))  # none skipped, none twice


def test_a_woken_pump_does_not_read_on_past_the_offsets_it_stamps() -> None:
    """The woken pump locks the group, stamps the topic's new messages and reads after the
    group's position in one transaction: it delivered 11-14 at once."""
    billing = past_end("wokenend", 10)
    Topic("wokenend").publish_many([{"n": n} for n in range(12)])  # as a publish wakes
    claim = broker.PumpClaim(100, RUNNER.worker_id, lease_seconds=30)
    pumped, claimed = broker.pump_claiming(billing, 100, 100, claim, sequence=True,
                                           woken=True)
    assert (pumped.made, claimed) == (0, [])
    assert pumped.ahead == (10, 2) and pumped.behind  # its member looks again at once
    assert broker.position("wokenend", "billing") == 2
    pump_all(billing)
    assert offsets("wokenend") == list(range(1, 15))


def test_the_group_s_own_look_sets_it_back_with_nothing_to_stamp() -> None:
    billing = past_end("lookend", 7)
    pumped = broker.pump_group(billing, batch=10, window=100, sequence=True)
    assert pumped == broker.Pumped(0, True, ahead=(7, 2))
    assert broker.position("lookend", "billing") == 2
    assert broker.pump_group(billing, batch=10, window=100, sequence=True) == broker.Pumped(
        0, False)
    publish("lookend", 3)
    pump_all(billing)
    assert offsets("lookend") == [1, 2, 3, 4, 5]


def test_operators_see_the_position_past_the_end_and_its_remedy(root) -> None:
    """Until a round sets it back (no reader of the topic runs), every view says so
    beside the lag (it said 0, and nothing else until a member had looked)."""
    past_end("shown", 10)
    [state] = broker.groups("shown", "billing")
    assert (state.past_end, state.lag, state.lag_shown) == (2, 0, "0 (past end)")
    remedy = "manage.py queuetopic reset billing --topic shown --to-offset 3"
    assert state.position_problem == (
        "position 10 is past the topic's last offset 2 (changed by hand?): the next 8 "
        "messages published (offsets 3 to 10) would not reach the group. A member of the "
        f"group sets it back to 2 at its next look, cancelling nothing; with none running: "
        f"{remedy}")
    out = StringIO()
    call_command("queuetopic", "groups", "--topic", "shown", stdout=out)
    assert "0 (past end)" in out.getvalue()
    assert "shown / billing: position 10 is past the topic's last offset 2" in out.getvalue()
    out = StringIO()
    call_command("queuetopic", "groups", "--topic", "shown", "--json", stdout=out)
    [data] = json.loads(out.getvalue())
    assert data["past_end"] and data["position_problem"] == state.position_problem
    out = StringIO()
    call_command("queuestats", stdout=out)
    assert remedy in out.getvalue()
    dashboard = root.get("/admin/django_mysqlq/queuestate/?refresh=0").content.decode()
    assert 'class="position-problem"' in dashboard and remedy in dashboard
    listed = root.get("/admin/django_mysqlq/topicgroup/?topic=shown").content.decode()
    assert "0 (past end)" in listed
    assert "past the end: position 10 &gt; last offset 2" in listed
    row = TopicGroup.objects.get(topic="shown")
    page = root.get(reverse("admin:django_mysqlq_topicgroup_change", args=[row.pk]))
    assert 'id="group-position-problem"' in page.content.decode()
    # The reset it names mends it.
    call_command("queuetopic", "reset", "billing", "--topic", "shown", "--to-offset", "3",
                 stdout=StringIO())
    [state] = broker.groups("shown", "billing")
    assert (state.past_end, state.position_problem, state.lag_shown) == (None, "", "0")


def test_a_counter_lowered_by_hand_leaves_a_group_at_the_highest_offset_as_it_is() -> None:
    """``last_offset`` set below the offsets given out, not the position raised: new
    messages get offsets after the highest one (the sequencer's repair), so the group is
    not past them; setting it back to the counter would deliver 3-10 again."""
    billing = group("lowered", "billing")
    publish("lowered", 10)
    assert broker.pump(billing, batch=100, window=100) == 10
    TopicState.objects.filter(name="lowered").update(last_offset=2)
    [state] = broker.groups("lowered", "billing")
    assert (state.past_end, state.position_problem) == (None, "")
    pump_all(billing)
    assert broker.position("lowered", "billing") == 10
    assert broker.last_offset("lowered") == 10  # (the look's round moved the counter)
    publish("lowered", 3)
    pump_all(billing)
    assert offsets("lowered") == list(range(1, 14))


def test_no_offset_is_given_while_a_group_past_the_end_is_held() -> None:
    """A round that can't take the row of a group past the end gives no offset: a skipping
    one stamps nothing (its caller looks again), a waiting one waits for the row."""
    billing = past_end("heldend", 10)
    Topic("heldend").publish_many([{"n": n} for n in range(12)])
    with held_by_stranger("SELECT * FROM mysqlq_topic_group WHERE topic = 'heldend' "
                          "FOR UPDATE"):
        assert broker.try_sequence("heldend") is None
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        try:
            with pytest.raises(OperationalError):  # (the lock wait's timeout, 1205)
                broker.sequence("heldend")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
        assert broker.last_offset("heldend") == 2
    assert broker.sequence("heldend") == 12
    assert broker.position("heldend", "billing") == 2
    pump_all(billing)
    assert offsets("heldend") == list(range(1, 15))
