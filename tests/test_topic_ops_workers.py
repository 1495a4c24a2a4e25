"""Operators against real workers: a reset while a worker consumes (backwards: every
offset handled again after it; forwards: the rest skipped), and a group handler past its
timeout (the ``topic_handler_overran`` signal in the worker, its log line, the dashboard)."""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from django_mysqlq import broker, ops
from django_mysqlq.models import Message, TopicGroup
from tests.conftest import wait_for
from tests.operator_support import OPERATOR
from tests.testapp import topic_ops_handlers
from tests.testapp.models import GateRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

DASHBOARD = "/admin/django_mysqlq/queuestate/"
ENV = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.topic_ops_handlers"}
WORKER = ("--concurrency", "4", "--batch", "8")


def started(worker) -> None:
    wait_for(lambda: "started: queues=" in worker.output(), timeout=60,
             message="the worker to start")


def stop(worker) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


def ended(label: str, after: float = 0.0) -> list[int]:
    return list(GateRun.objects.filter(label=label, key="ops:", edge="end", at__gt=after)
                .values_list("seq", flat=True))


def publish(label: str, count: int, **extra: object) -> None:
    topic_ops_handlers.feed.publish_many(
        [{"label": label, "seq": seq, **extra} for seq in range(count)])


def test_reset_while_a_worker_consumes(start_worker) -> None:
    worker = start_worker(*WORKER, env=ENV)
    started(worker)
    wait_for(lambda: TopicGroup.objects.filter(topic="opsfeed", group_name="ops").exists(),
             message="the group's row")
    total = 150
    publish("reset", total, sleep_ms=10)
    wait_for(lambda: len(ended("reset")) >= 40, timeout=60, message="40 handled")
    moment = time.time()
    done = broker.reset_group("opsfeed", "ops", broker.ResetTarget(edge="earliest"), OPERATOR)
    assert done.new_position == 0 and done.old_position > 0
    # Every offset is delivered again after the reset, and handled.
    wait_for(lambda: set(ended("reset", after=moment)) >= set(range(total)), timeout=90,
             message="every message handled again after the reset")
    wait_for(lambda: not Message.objects.filter(queue="group:ops").exists(), timeout=30,
             message="the group's queue to empty")
    assert broker.position("opsfeed", "ops") == broker.last_offset("opsfeed") == total
    # At most the ones running at the reset ran a third time; none was lost.
    handled = ended("reset")
    assert len(handled) <= 2 * total + 4 * 2, len(handled)

    # Forwards: skip a fresh backlog while it is being consumed.
    publish("skip", total, sleep_ms=20)
    wait_for(lambda: len(ended("skip")) >= 10, timeout=60, message="10 of the backlog")
    done = broker.reset_group("opsfeed", "ops", broker.ResetTarget(edge="latest"), OPERATOR)
    assert done.new_position == 2 * total
    wait_for(lambda: not Message.objects.filter(queue="group:ops").exists(), timeout=30,
             message="the group's queue to empty")
    # The member pumps only what it claims (its batch of 8) while nothing waits, so the
    # backlog is mostly not pumped yet: skipped by the position, or cancelled if waiting.
    skipped = set(range(total)) - set(ended("skip"))
    assert len(skipped) >= max(done.cancelled, total // 2), (len(skipped), done.cancelled)
    stop(worker)
    assert "Traceback" not in worker.output()


def test_a_handler_past_its_timeout_is_signalled_logged_and_shown(start_worker, root,
                                                                   tmp_path: Path) -> None:
    worker = start_worker(*WORKER, env=ENV)
    started(worker)
    wait_for(lambda: TopicGroup.objects.filter(group_name="slowops").exists(),
             message="the group's row")
    # It runs until the gate opens, after every check of it running, however loaded the
    # machine (a minute at most).
    gate = tmp_path / "gate"
    publish("slow", 1, slow_ms=60_000, gate=str(gate))
    running = wait_for(broker.overran_deliveries, timeout=30,
                       message="the dashboard's overran delivery")
    overran = running[0]  # type: ignore[index]
    assert overran.task_name == "topic:opsfeed:slowops"
    # Named by topic, group and offset everywhere it is shown, as in the worker's log.
    assert (overran.topic, overran.group, overran.offset) == ("opsfeed", "slowops", 1)
    text, raw = io.StringIO(), io.StringIO()
    call_command("queuestats", stdout=text)
    call_command("queuestats", "--json", stdout=raw)
    assert ("WARNING: topic handler of group 'slowops' on topic 'opsfeed' has run"
            in text.getvalue()), text.getvalue()
    assert f"on offset 1 (delivery #{overran.message_id}), past its timeout" in text.getvalue()
    listed = json.loads(raw.getvalue())["overran"]
    assert [(o["topic"], o["group"], o["offset"], o["task"]) for o in listed] == [
        ("opsfeed", "slowops", 1, "topic:opsfeed:slowops")]
    page = root.get(DASHBOARD)
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="topic-overran"' in body and "group slowops on topic opsfeed, offset 1" in body
    assert 'id="topic-opsfeed"' in body
    data = ops.dashboard()
    assert [o.message_id for o in data.overran] == [running[0].message_id]  # type: ignore[index]
    assert any(g.group == "slowops" for g in data.groups)
    assert data.topics[0].name == "opsfeed" and data.topics[0].published[1] == 1
    wait_for(lambda: GateRun.objects.filter(label="alert:opsfeed", key="slowops:",
                                            edge="alert", seq=1).exists(),
             message="the topic_handler_overran signal in the worker")
    wait_for(lambda: "Topic handler of group 'slowops' on topic 'opsfeed'" in worker.output(),
             message="the log line")
    gate.touch()  # the handler ends now: the stop below is a clean one
    stop(worker)
