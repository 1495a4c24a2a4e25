"""Retiring a consumer group, against the real MariaDB: a group subscribed again under the
name of an older one starts at its own ``start`` (not after the older one's last
delivery), and ``manage.py queuetopic drop`` retires a group, saying to run it again when a
lock wait stops it, as a reset does (no worker process: the pump and acks are called the
way a worker calls them)."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_mysqlq import broker
from django_mysqlq.messages import AttemptResult
from django_mysqlq.models import Attempt, Message, TopicDelivery, TopicGroup
from tests.conftest import held_by_stranger
from tests.operator_support import RUNNER
from tests.topic_ops_support import claim, forget_before, group, handle, publish, spec

pytestmark = pytest.mark.django_db(transaction=True)


def abandoned_by_hand(topic: str, name: str) -> None:
    """An old group ``name`` that had offsets 1-6 delivered and handled, then abandoned as
    the docs used to say (its row deleted by hand); retention deleted offsets 1-2 and
    their links since. Offsets 7-10 were published after it was abandoned."""
    old = group(topic, name)
    publish(topic, 6)
    assert broker.pump(old, batch=10, window=100) == 6
    handle(old, 6)
    TopicGroup.objects.filter(topic=topic, group_name=name).delete()
    publish(topic, 4, start=6)
    forget_before(topic, 3)
    TopicDelivery.objects.filter(topic=topic, offset__lt=3).delete()


@pytest.mark.parametrize(("start", "position"), [("latest", 10), ("earliest", 2)])
def test_a_group_subscribed_again_after_a_hand_delete_starts_at_its_start(
        start: str, position: int) -> None:
    """Before, its creation went on after the old group's last delivery (offset 6): with
    ``latest`` it handled the kept messages 7-10 published before it was subscribed, with
    ``earliest`` it skipped the kept messages 3-6."""
    abandoned_by_hand("events", "billing")
    again = spec("events", "billing", start=start)
    assert broker.create_group(again) is True
    assert broker.position("events", "billing") == position


def test_a_row_deleted_while_its_members_run_is_still_made_again_after_its_last_delivery(
        caplog) -> None:
    """The one case that goes on after the group's last delivery: a running member's pump
    finds no row (``_missing``)."""
    abandoned_by_hand("events", "billing")
    assert_a_running_member_makes_it_again_at(6, caplog)


def assert_a_running_member_makes_it_again_at(position: int, caplog: Any) -> None:
    """A member of events/billing still running finds no row: it makes it again there."""
    member = spec("events", "billing", start="latest")
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        assert broker.pump_group(member, batch=10, window=10, recreate=True).made == 0
    assert broker.position("events", "billing") == position
    assert f"made it again at position {position}" in caplog.text


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("queuetopic", *args, stdout=out)
    return out.getvalue()


def statuses(queue: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for status in Message.objects.filter(queue=queue).values_list("status", flat=True):
        found[status] = found.get(status, 0) + 1
    return found


def test_drop_cancels_waiting_and_dead_deliveries_deletes_links_and_row_leaves_running(
        ) -> None:
    billing = group("orders", "billing")
    audit = group("orders", "audit")
    publish("orders", 6)
    publish("orders", 3, key="k", start=6)
    assert broker.pump(billing, batch=100, window=100) == 9
    assert broker.pump(audit, batch=100, window=100) == 9
    handle(billing, 1)  # offset 1 handled
    handle(billing, 1, fail=True)  # offset 2 dead
    [retried] = claim(billing, 1)  # offset 3 fails, its retry scheduled
    broker.fail(retried, RUNNER, AttemptResult(
        started_at=broker.database_now(), error_class="RuntimeError",
        error_message="try again", traceback="..."), retry=True, retry_in=3600)
    [running] = claim(billing, 1)  # offset 4 running
    assert statuses(billing.queue) == {"ready": 3, "scheduled": 1, "blocked": 2, "dead": 1,
                                       "claimed": 1}
    out = run("drop", "billing", "--topic", "orders")
    assert ("Dropped group 'billing' of topic 'orders' (position 9): 6 waiting deliveries "
            "cancelled, 1 dead deliveries cancelled, 9 delivery links deleted; 1 running "
            "deliveries left to finish") in out
    assert not TopicGroup.objects.filter(topic="orders", group_name="billing").exists()
    assert not TopicDelivery.objects.filter(topic="orders", group_name="billing").exists()
    assert statuses(billing.queue) == {"claimed": 1}
    assert Attempt.objects.filter(task_name=billing.task_name, outcome="cancelled",
                                  error_message="topic group dropped").count() == 7
    assert [g.group for g in broker.groups("orders")] == ["audit"]  # retention: audit only
    assert TopicDelivery.objects.filter(topic="orders", group_name="audit").count() == 9
    assert statuses(audit.queue) == {"ready": 7, "blocked": 2}
    # The running delivery finishes: its ack needs no link and no group row.
    broker.ack(running, RUNNER, AttemptResult(started_at=broker.database_now()))
    assert not Message.objects.filter(queue=billing.queue).exists()
    assert Attempt.objects.filter(message_id=running.id, outcome="succeeded").exists()


def test_drop_refuses_an_unknown_group_and_a_group_dropped_already() -> None:
    group("orders", "billing")
    with pytest.raises(CommandError, match="Topic 'orders' has no consumer group 'nobody'"):
        run("drop", "nobody", "--topic", "orders")
    with pytest.raises(CommandError, match="has no consumer group 'billing'"):
        run("drop", "billing", "--topic", "elsewhere")
    assert json.loads(run("drop", "billing", "--topic", "orders", "--json")) == {
        "topic": "orders", "group": "billing", "position": 0, "cancelled_waiting": 0,
        "cancelled_dead": 0, "links_deleted": 0, "running": 0}
    with pytest.raises(CommandError, match="no consumer group 'billing'"):
        run("drop", "billing", "--topic", "orders")


def dropped(topic: str, name: str) -> None:
    """:func:`abandoned_by_hand`, but retired with ``queuetopic drop``."""
    old = group(topic, name)
    publish(topic, 6)
    assert broker.pump(old, batch=10, window=100) == 6
    handle(old, 6)
    publish(topic, 4, start=6)
    forget_before(topic, 3)
    TopicDelivery.objects.filter(topic=topic, offset__lt=3).delete()
    done = json.loads(run("drop", name, "--topic", topic, "--json"))
    assert (done["position"], done["links_deleted"]) == (6, 4)


@pytest.mark.parametrize(("start", "position", "offsets"),
                         [("latest", 10, []), ("earliest", 2, [3, 4, 5, 6, 7, 8, 9, 10])])
def test_a_group_subscribed_again_after_a_drop_starts_at_its_start(
        start: str, position: int, offsets: list[int]) -> None:
    dropped("events", "billing")
    again = spec("events", "billing", start=start)
    assert broker.create_group(again) is True
    assert broker.position("events", "billing") == position
    broker.pump(again, batch=100, window=100)
    assert sorted(TopicDelivery.objects.filter(topic="events", group_name="billing")
                  .values_list("offset", flat=True)) == offsets


def test_a_member_still_running_a_dropped_group_makes_it_again_at_its_start(caplog) -> None:
    """Not after the dropped group's last delivery (offset 6): a hand delete keeps the
    links, and a running member goes on from them (see above)."""
    dropped("events", "billing")
    assert_a_running_member_makes_it_again_at(10, caplog)


def test_drop_of_a_hold_group_cancels_the_dead_head_and_the_deliveries_it_held() -> None:
    held = group("orders", "billing", on_dead="hold")
    publish("orders", 3, key="k")
    assert broker.pump(held, batch=100, window=100) == 3
    handle(held, 1, fail=True)  # the key's first dies and holds the other two
    assert statuses(held.queue) == {"dead": 1, "blocked": 2}
    out = run("drop", "billing", "--topic", "orders")
    assert "2 waiting deliveries cancelled, 1 dead deliveries cancelled" in out
    assert not Message.objects.filter(queue=held.queue).exists()  # none promoted


@pytest.fixture
def short_lock_waits(monkeypatch):
    """This session's lock waits last a second, tried twice (not fifty seconds, 8 times)."""
    from django.db import connection

    from django_mysqlq.broker import base

    monkeypatch.setattr(base, "LOCK_RETRY_LIMIT", 2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@session.innodb_lock_wait_timeout")
        [(before,)] = cursor.fetchall()
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [before])


GROUP_ROW_SQL = ("SELECT * FROM mysqlq_topic_group WHERE topic = 'orders' "
                 "AND group_name = 'billing' FOR UPDATE")


def test_a_drop_that_waits_out_the_group_rows_lock_says_to_run_it_again(
        short_lock_waits) -> None:
    """The lock wait on the group's own row (another operator's reset or drop holding it)
    used to end in a bare OperationalError traceback: the "nothing changed, run it again"
    message covered only what came after that lock."""
    made = group("orders", "billing")
    publish("orders", 3)
    assert broker.pump(made, batch=100, window=100) == 3
    with held_by_stranger(GROUP_ROW_SQL):
        with pytest.raises(CommandError, match=r"Consumer group 'billing' of topic 'orders' "
                                               r"was not dropped: .*Lock wait timeout.*so "
                                               r"nothing changed\. Run the same drop again"):
            run("drop", "billing", "--topic", "orders")
    assert TopicGroup.objects.filter(topic="orders", group_name="billing").exists()
    assert statuses(made.queue) == {"ready": 3}
    assert "3 waiting deliveries cancelled" in run("drop", "billing", "--topic", "orders")


def test_a_reset_that_waits_out_the_group_rows_lock_says_to_run_it_again(
        short_lock_waits) -> None:
    """The reset takes the same row lock first, and had the same gap: its message covered
    only a failed cancel."""
    made = group("orders", "billing")
    publish("orders", 3)
    assert broker.pump(made, batch=100, window=100) == 3
    with held_by_stranger(GROUP_ROW_SQL):
        with pytest.raises(CommandError, match=r"Consumer group 'billing' of topic 'orders' "
                                               r"was not reset: .*Lock wait timeout.*so "
                                               r"nothing changed: its position stays where it "
                                               r"was\. Run the same reset again\. If it fails "
                                               r"again, another transaction holds the group's "
                                               r"row"):
            run("reset", "billing", "--topic", "orders", "--to-offset", "2")
    assert broker.position("orders", "billing") == 3
    assert statuses(made.queue) == {"ready": 3}
    assert "position 3 -> 1" in run("reset", "billing", "--topic", "orders", "--to-offset", "2")
