"""Run a ``--burst`` worker to its end and check what became of each message."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from django_mysqlq.models import Attempt, Message
from django_mysqlq.worker.draining import EXIT_DEAD
from tests.testapp import tasks

#: Seconds a --burst worker gets to drain a handful of messages before the test fails.
PATIENCE = 20.0


def run_burst(start_worker, *args: str, patience: float = PATIENCE,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """Run a --burst worker to its end; return its JSON summary and its log."""
    worker = start_worker("--burst", "--json-summary", "--burst-wait", "2", *args, env=env)
    try:
        status = worker.wait(timeout=patience)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the --burst worker was still running after {patience}s; stuck rows: "
                    f"{list(Message.objects.values('id', 'task_name', 'status'))}\n"
                    f"{worker.output()[-3000:]}")
    output = worker.output()
    line = next((line for line in reversed(output.splitlines()) if line.startswith("{")), "")
    assert line, output
    summary = json.loads(line)
    assert status == expected_status(summary["dead"], args), output
    return summary, output


def expected_status(dead: int, args: tuple[str, ...] = ()) -> int:
    """A --burst worker's exit status: EXIT_DEAD when messages went dead, unless
    --exit-zero."""
    return EXIT_DEAD if dead and "--exit-zero" not in args else 0


def enqueue_good(label: str) -> int:
    return tasks.record.enqueue(label).id


def assert_succeeded(*message_ids: int) -> None:
    """These messages finished with one successful attempt and left the hot table."""
    for message_id in message_ids:
        outcomes = list(Attempt.objects.for_message(message_id).values_list("outcome",
                                                                            flat=True))
        assert outcomes == ["succeeded"], (message_id, outcomes)
    assert not Message.objects.filter(pk__in=message_ids).exists()


def assert_dead(message_id: int, outcomes: list[str], error_class: str) -> Message:
    """This message is dead after exactly these attempts, each recording ``error_class``."""
    message = Message.objects.get(pk=message_id)
    assert message.status == "dead", message.last_error
    attempts = list(Attempt.objects.for_message(message_id))
    assert [a.outcome for a in attempts] == outcomes
    assert {a.error_class for a in attempts} == {error_class}
    assert message.last_error.startswith(error_class)
    return message
