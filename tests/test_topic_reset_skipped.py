"""A reset's waiting deliveries at offsets at or before its new position: skipped for good
(the target is the next offset the group gets), and said so.

Before, ``queuetopic reset billing --topic orders --to-offset 6`` with offsets 1-10
waiting said "10 waiting deliveries cancelled" (the result's comment: "their offsets
come again from the new position"): offsets 1-5 never ran, and nothing said so. The
command, the admin and the log now count them, name their offsets and the replay that
brings them back; a reset before all of them says nothing more."""

from __future__ import annotations

import io
import json
import logging
import re
import shlex

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_mysqlq import Topic, broker, topicops
from django_mysqlq.messages import AttemptResult
from django_mysqlq.models import Message, TopicDelivery, TopicGroup
from tests.operator_support import OPERATOR, RUNNER
from tests.topic_ops_support import claim, forget_before, group, handle, publish

pytestmark = pytest.mark.django_db(transaction=True)

REPLAY = re.compile(r"replay (?:them|it) with (queuetopic replay [^;)]*?) if")


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("queuetopic", *args, stdout=out)
    return out.getvalue()


def waiting_offsets(made: broker.GroupSpec) -> list[int]:
    ids = Message.objects.filter(queue=made.queue).values_list("id", flat=True)
    return sorted(TopicDelivery.objects.filter(message_id__in=list(ids))
                  .values_list("offset", flat=True))


def ten_waiting() -> broker.GroupSpec:
    made = group("orders", "billing")
    publish("orders", 10)
    broker.pump(made, batch=100, window=100)
    assert waiting_offsets(made) == list(range(1, 11))
    return made


def test_a_reset_inside_the_waiting_range_says_what_it_skips_and_the_replay_brings_it_back(
        caplog) -> None:
    made = ten_waiting()
    with caplog.at_level(logging.WARNING, "django_mysqlq"):
        out = run("reset", "billing", "--topic", "orders", "--to-offset", "6")
    assert out.strip() == (
        "Group 'billing' of topic 'orders': position 10 -> 5 (next offset 6); 10 waiting "
        "deliveries cancelled: 5 of them (offsets 1-5) are before offset 6, the next one "
        "the group gets, and will not run (replay them with queuetopic replay --topic "
        "orders --group billing --from-offset 1 --to-offset 5 if they should; a replay runs "
        "them after the group's later deliveries: for publish order, each key's too, reset "
        "with --to-offset 1 instead); the other 5 come again.")
    [logged] = [r.getMessage() for r in caplog.records if "reset to offset 6" in
                r.getMessage()]
    assert logged.endswith("position 10 -> 5; 10 waiting deliveries cancelled: 5 of them "
                           "(offsets 1-5) are before offset 6, the next one the group "
                           "gets, and will not run unless replayed."), logged
    assert broker.pump(made, batch=100, window=100) == 5
    assert waiting_offsets(made) == [6, 7, 8, 9, 10]  # 1-5: gone, as said
    # The replay the reset names brings exactly the skipped ones back.
    [command] = REPLAY.findall(out)
    replayed = run(*shlex.split(command)[1:])
    assert "Replayed offsets 1..5" in replayed and "5 new deliveries" in replayed
    assert waiting_offsets(made) == list(range(1, 11))


def test_a_reset_forwards_past_every_waiting_one_skips_them_all() -> None:
    made = ten_waiting()
    out = run("reset", "billing", "--topic", "orders", "--latest")
    assert out.strip() == (
        "Group 'billing' of topic 'orders': position 10 -> 10 (next offset 11); 10 waiting "
        "deliveries cancelled: all 10 (offsets 1-10) are before offset 11, the next one the "
        "group gets, and will not run (replay them with queuetopic replay --topic orders "
        "--group billing --from-offset 1 --to-offset 10 if they should; a replay runs them "
        "after the group's later deliveries: for publish order, each key's too, reset with "
        "--to-offset 1 instead).")
    assert broker.pump(made, batch=100, window=100) == 0
    assert waiting_offsets(made) == []
    done = broker.reset_group("orders", "billing", broker.ResetTarget(edge="latest"),
                              OPERATOR)  # nothing waits any more
    assert (done.cancelled, done.skipped, done.skipped_offsets) == (0, 0, None)


def test_a_reset_backwards_before_every_waiting_one_skips_none_and_says_nothing_more(
        ) -> None:
    made = ten_waiting()
    handle(made, 4)  # offsets 1-4 ran; 5-10 wait
    out = run("reset", "billing", "--topic", "orders", "--to-offset", "3")
    assert out.strip() == ("Group 'billing' of topic 'orders': position 10 -> 2 (next "
                           "offset 3); 6 waiting deliveries cancelled.")
    assert broker.pump(made, batch=100, window=100) == 8  # 3-10 again, none twice
    assert waiting_offsets(made) == list(range(3, 11))


def test_skipped_offsets_with_gaps_and_one_whose_message_retention_deleted() -> None:
    made = group("orders", "billing")
    publish("orders", 5)
    broker.pump(made, batch=100, window=100)
    first, second = sorted(claim(made, 2), key=lambda m: m.id)
    broker.ack(second, RUNNER, AttemptResult(started_at=broker.database_now()))  # offset 2
    broker.fail(first, RUNNER, AttemptResult(  # offset 1 waits for its retry
        started_at=broker.database_now(), error_class="RuntimeError",
        error_message="handler broke", traceback="..."), retry=True, retry_in=3600)
    out = run("reset", "billing", "--topic", "orders", "--to-offset", "4")
    assert ("4 waiting deliveries cancelled: 2 of them (offsets 1-3, not every one between) "
            "are before offset 4, the next one the group gets, and will not run (replay them "
            "with queuetopic replay --topic orders --group billing --from-offset 1 "
            "--to-offset 3 if they should; the range's other offsets would run again too); "
            "the other 2 come again.") in out
    # Retention deleted offsets 1-2 and their links while their deliveries waited.
    run("reset", "billing", "--topic", "orders", "--earliest")
    broker.pump(made, batch=100, window=100)
    forget_before("orders", 3)
    TopicDelivery.objects.filter(topic="orders", offset__lt=3).delete()
    done = broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=4), OPERATOR)
    assert (done.cancelled, done.skipped, done.skipped_offsets, done.skipped_gone) == (
        5, 3, (3, 3), 2)
    assert topicops.reset_cancelled(done, lambda a, b: f"R{a}-{b}") == (
        "5 waiting deliveries cancelled: 3 of them are before offset 4, the next one the "
        "group gets, and will not run: 1 of them (offset 3) can be replayed with R3-3 if "
        "it should, 2 cannot (retention deleted their messages); the other 2 come again.")


def test_the_admin_says_what_a_reset_skips(root) -> None:
    made = ten_waiting()
    row = TopicGroup.objects.get(group_name="billing")
    operate = reverse("admin:django_mysqlq_topicgroup_operate", args=[row.pk])
    response = root.post(operate, {"op": "reset", "to": "offset", "value": "6"}, follow=True)
    [said] = [str(m) for m in response.context["messages"]]
    assert said == (
        "Group billing of orders reset to offset 6: position 10 -> 5; 10 waiting deliveries "
        "cancelled: 5 of them (offsets 1-5) are before offset 6, the next one the group "
        "gets, and will not run (replay them with the replay form of the group's page (from "
        "1 to 5) if they should; a replay runs them after the group's later deliveries: for "
        "publish order, each key's too, reset to offset 1 instead); the other 5 come "
        "again.")
    assert [m.level_tag for m in response.context["messages"]] == ["warning"]
    assert "--" not in said  # the page's own words, not the command's options
    broker.pump(made, batch=100, window=100)  # 6-10 again
    response = root.post(operate, {"op": "reset", "to": "offset", "value": "1"}, follow=True)
    [said] = [str(m) for m in response.context["messages"]]
    assert said.endswith("position 10 -> 0; 5 waiting deliveries cancelled.")
    assert [m.level_tag for m in response.context["messages"]] == ["success"]


def test_the_reset_it_names_for_publish_order_runs_each_skipped_key_in_order() -> None:
    """A replay of the skipped ones runs them after the group's later deliveries (a key
    handled 6-10 then 1-5): the reset the message names instead gives 1-10 in order."""
    made = group("orders", "billing")
    for n in range(10):
        Topic("orders").publish({"n": n}, key="k")
    broker.sequence("orders")
    broker.pump(made, batch=100, window=100)
    out = run("reset", "billing", "--topic", "orders", "--to-offset", "6")
    assert "reset with --to-offset 1 instead" in out
    run("reset", "billing", "--topic", "orders", "--to-offset", "1")
    broker.pump(made, batch=100, window=100)
    handled = []
    while taken := claim(made, 100):
        for message in taken:
            handled.append(json.loads(message.payload)["kwargs"]["offset"])
            broker.ack(message, RUNNER, AttemptResult(started_at=broker.database_now()))
    assert handled == list(range(1, 11))
