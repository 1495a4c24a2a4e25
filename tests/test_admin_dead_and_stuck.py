"""What the dead and stuck lists show: the last error on one line, filters that offer only
what the list holds, and attempts that add up after a requeue."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from django_mysqlq import broker
from django_mysqlq.admin import filters
from django_mysqlq.admin.messages import ERROR_WIDTH, MessageAdmin, first_line
from django_mysqlq.messages import AttemptResult
from django_mysqlq.models import Message
from tests.conftest import wait_for
from tests.operator_support import OPERATOR, RUNNER, claim_in_peer, make_dead
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = reverse("admin:django_mysqlq_deadmessage_changelist")
STUCK = reverse("admin:django_mysqlq_stuckmessage_changelist")


def cells(page: str, column: str) -> list[str]:
    """The text of one column's cells in a change list."""
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in
            re.findall(rf'<td class="field-{column}[^"]*">(.*?)</td>', page, re.S)]


def fail_once(message_id: int, error: str = "ValueError: boom") -> str:
    """Claim ``message_id`` (the queue's only ready message) and fail it as a worker
    would, retrying while attempts are left; returns the outcome."""
    def claimed() -> list[broker.ClaimedMessage]:
        broker.promote_due()  # a retry is scheduled a moment ahead
        return broker.claim(["default"], 1, RUNNER.worker_id, lease_seconds=30)

    [message] = wait_for(claimed, timeout=10, message="the message to be ready")
    assert message.id == message_id
    error_class, _, text = error.partition(": ")
    return broker.fail(message, RUNNER, AttemptResult(
        started_at=broker.database_now(), error_class=error_class, error_message=text))


def exhausted(task=tasks.atomic_fails_after_write) -> int:
    """A message that spent all its attempts (max_attempts=2), as a worker leaves it."""
    handle = task.enqueue("x")
    while fail_once(handle.id) != "failed":
        pass
    return handle.id


# ------------------------------------------------------------------ the last error


def test_first_line_cuts_to_one_line_with_an_ellipsis():
    assert first_line("ValueError: boom") == "ValueError: boom"
    assert first_line("\n  KeyError: 'x'\nTraceback ...\n") == "KeyError: 'x' \u2026"
    long = "RuntimeError: " + "x" * 300
    cut = first_line(long)
    assert len(cut) == ERROR_WIDTH and cut.endswith("\u2026") and long.startswith(cut[:-1])
    assert first_line("") == first_line("  \n ") == ""


def test_the_dead_list_shows_each_last_error_on_one_line_and_the_page_the_whole(root):
    long = "ValueError: " + "no such customer " * 20
    dead = make_dead(label="a")
    Message.objects.filter(pk=dead).update(last_error=long + "\nsecond line of the error")
    page = root.get(DEAD).content.decode()
    [shown] = cells(page, "last_error_line")
    assert shown == first_line(long) and len(shown) == ERROR_WIDTH
    assert "second line" not in page
    detail = root.get(reverse("admin:django_mysqlq_message_change", args=[dead]))
    assert "second line of the error" in detail.content.decode()
    assert long.strip() in detail.content.decode()


def test_the_stuck_list_shows_the_last_error_of_an_earlier_attempt(root):
    handle = tasks.record.enqueue("orphan")
    Message.objects.filter(pk=handle.id).update(last_error="OSError: disk full\nmore")
    claim_in_peer(handle.id)
    wait_for(broker.stuck_messages, timeout=5, message="the peer to vanish")
    page = root.get(STUCK).content.decode()
    assert cells(page, "last_error_line") == ["OSError: disk full \u2026"]


# ------------------------------------------------------------------ the dead list's filters


def choices(page: str, parameter: str) -> list[str]:
    """The values a list filter offers (links ``?parameter=value``), "All" left out."""
    return sorted(set(re.findall(rf'href="\?{parameter}=([^"&]+)"', page)))


def test_the_dead_lists_filters_offer_only_queues_and_tasks_with_dead_messages(root):
    make_dead(tasks.always_fails)
    tasks.record.enqueue("ready")           # a task with no dead message
    tasks.on_other_queue.enqueue("other")   # a queue with no dead message
    dead_page = root.get(DEAD).content.decode()
    assert choices(dead_page, "task") == ["tests.testapp.tasks.always_fails"]
    assert choices(dead_page, "queue") == ["default"]
    # The full list still offers every task and queue.
    all_page = root.get(reverse("admin:django_mysqlq_message_changelist")).content.decode()
    assert choices(all_page, "task") == ["tests.testapp.tasks.always_fails",
                                         "tests.testapp.tasks.on_other_queue",
                                         "tests.testapp.tasks.record"]
    assert choices(all_page, "queue") == ["default", "other"]


def test_queues_holding_finds_a_status_behind_many_others():
    for label in "abc":
        tasks.on_other_queue.enqueue(label)
    assert broker.queues_holding("dead") == []
    make_dead()
    assert broker.queues_holding("dead") == ["default"]
    assert broker.queues_holding("ready") == ["other"]
    assert filters.DeadQueueFilter.status == filters.DeadTaskFilter.status == "dead"


# ------------------------------------------------------------------ attempts after a requeue


def test_a_requeued_message_out_of_attempts_gets_one_more_and_reads_sensibly(root):
    dead = exhausted()
    row = Message.objects.get(pk=dead)
    assert (row.status, row.attempts, row.max_attempts) == ("dead", 2, 2)
    assert broker.requeue([dead], OPERATOR) == [dead]
    row = Message.objects.get(pk=dead)
    # One more attempt: its own limit rises by one, so attempts never pass it.
    assert (row.status, row.attempts, row.max_attempts) == ("ready", 2, 3)
    assert fail_once(dead) == "failed"  # that one attempt, and no further retry
    row = Message.objects.get(pk=dead)
    assert (row.status, row.attempts, row.max_attempts) == ("dead", 3, 3)
    assert cells(root.get(DEAD).content.decode(), "attempts_label") == ["3/3"]


def test_requeue_leaves_the_limit_of_a_message_with_attempts_left_alone():
    handle = tasks.atomic_fails_after_write.enqueue("x")
    assert fail_once(handle.id) == "retried"
    broker.requeue([handle.id], OPERATOR)
    row = Message.objects.get(pk=handle.id)
    assert (row.attempts, row.max_attempts) == (1, 2)
    assert fail_once(handle.id) == "failed"


def test_requeue_with_reset_keeps_the_limit_and_starts_over():
    dead = exhausted()
    broker.requeue([dead], OPERATOR, reset_attempts=True)
    row = Message.objects.get(pk=dead)
    assert (row.status, row.attempts, row.max_attempts) == ("ready", 0, 2)
    assert fail_once(dead) == "retried" and fail_once(dead) == "failed"


def test_a_row_requeued_by_an_older_version_says_so_instead_of_3_of_2():
    dead = exhausted()
    row = Message.objects.get(pk=dead)
    row.attempts = 3  # what requeue + one more attempt left behind before
    assert MessageAdmin.attempts_label(None, row) == "3 (max 2, requeued)"  # type: ignore[arg-type]
    row.attempts = 2
    assert MessageAdmin.attempts_label(None, row) == "2/2"  # type: ignore[arg-type]
