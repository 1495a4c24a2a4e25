"""``runqueueworker --processes``: a task that ends just as its worker acts on its timeout.

The control thread fails an overdue attempt and ends the process; the task's thread may
end the same attempt meanwhile (ack it, hand it to the acker, fail it). Whichever comes
first settles it: each attempt gets one line, one count and one history row. Made
deterministic by tests/testapp/overrun_tasks.py, in a real worker process.
"""

from __future__ import annotations

import re

import pytest

from django_mysqlq.models import Attempt, Message
from tests.testapp import overrun_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

RIG = {"MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.overrun_tasks"}
TIMEOUT = "django_mysqlq.exceptions.TaskTimeout"


def _run(start_worker, handle, ack_delay: str = "0.02") -> str:
    supervisor = start_worker("--burst", "--burst-wait", "1", "--processes", "1",
                              "--concurrency", "1",
                              env={**RIG, "MYSQLQ_TEST_ACK_DELAY": ack_delay})
    supervisor.wait(timeout=60)
    output = supervisor.output()
    assert not Message.objects.filter(pk=handle.id).exclude(status="dead").exists(), output
    return output


def _one_line_and_count_per_attempt(output: str, message_id: int) -> list[str]:
    """Each attempt's one line (in order), checked against history and the summary."""
    attempts = list(Attempt.objects.for_message(message_id))
    lines = [line for line in output.splitlines() if f" id={message_id} " in line
             and " outcome=" in line]
    assert [re.search(r" attempt=(\d+)/", line)[1] for line in lines] == \
        [str(a.attempt) for a in attempts], output
    for line, attempt in zip(lines, attempts, strict=True):
        assert f" outcome={attempt.outcome} " in line, output
    summary = [line for line in output.splitlines() if line.startswith("Summary: ")]
    succeeded = sum(a.outcome == "succeeded" for a in attempts)
    assert len(summary) == 1, output
    assert summary[0].startswith(
        f"Summary: processed={len(attempts)} succeeded={succeeded} unacked=0 "
        f"failed={len(attempts) - succeeded} "), output
    assert " lost=0 " in summary[0], output
    assert "recovered by a peer" not in output, output
    return lines


@pytest.mark.parametrize("ack_delay", ["0.02", "2"], ids=["ack-written", "ack-pending"])
def test_a_success_just_before_the_abort_is_a_success(start_worker, ack_delay):
    # The task returns as its overrun is seen, before the attempt is failed: its ack is
    # written first (or waits in the acker): it succeeded, and the process goes on.
    handle = overrun_tasks.ends_at_overrun.enqueue("at_overrun")
    output = _run(start_worker, handle, ack_delay)
    lines = _one_line_and_count_per_attempt(output, handle.id)
    assert len(lines) == 1 and " outcome=succeeded " in lines[0], output
    assert Message.objects.filter(pk=handle.id).count() == 0
    assert "ended as its timeout was acted on" in output
    assert "restarting this worker process" not in output


def test_a_failure_just_before_the_abort_is_its_own(start_worker):
    handle = overrun_tasks.ends_at_overrun.enqueue("at_overrun", raises=True)
    output = _run(start_worker, handle)
    lines = _one_line_and_count_per_attempt(output, handle.id)
    assert len(lines) == 2, output
    assert all("error=RuntimeError: ended as it overran" in line for line in lines), output
    assert Message.objects.get(pk=handle.id).status == "dead"


def test_an_atomic_success_just_before_the_abort_is_a_success(start_worker):
    handle = overrun_tasks.atomic_ends_at_overrun.enqueue("at_overrun")
    output = _run(start_worker, handle)
    lines = _one_line_and_count_per_attempt(output, handle.id)
    assert len(lines) == 1 and " outcome=succeeded " in lines[0], output


@pytest.mark.parametrize("kind", ["returns", "raises", "atomic"])
def test_a_task_ending_after_its_abort_failed_it_records_nothing_more(start_worker, kind):
    # The attempt was failed for its timeout (line and count written); then the task
    # ends, before the process is gone: its success, its failure or its atomic ack is
    # not recorded, logged or counted again (it was: outcome=lost "recovered by a peer").
    if kind == "atomic":
        handle = overrun_tasks.atomic_ends_at_overrun.enqueue("after_fail")
    else:
        handle = overrun_tasks.ends_at_overrun.enqueue("after_fail", raises=kind == "raises")
    output = _run(start_worker, handle)
    lines = _one_line_and_count_per_attempt(output, handle.id)
    assert len(lines) == 2, output
    assert [a.error_class for a in Attempt.objects.for_message(handle.id)] == [TIMEOUT] * 2
    assert Message.objects.get(pk=handle.id).status == "dead"
