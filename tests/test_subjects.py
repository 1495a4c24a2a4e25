"""Ordered subjects at the broker: only a subject's head is ready; its ack, retry, death,
cancel or requeue moves the next one in the same transaction (no poll, no sweep)."""

from __future__ import annotations

import pytest

from django_mysqlq import broker
from django_mysqlq.broker import Operator
from django_mysqlq.models import Attempt, Message
from tests.subject_support import ack, claim, failed, gate, make_due, status
from tests.testapp import gated
from tests.testapp.gated import ordered_dies, ordered_dies_skipping, ordered_step

pytestmark = pytest.mark.django_db(transaction=True)

OPERATOR = Operator("cli:test")


def enqueue(key: str, *seqs: int, task=ordered_step) -> list[int]:
    return [task.enqueue(key, seq, "t").id for seq in seqs]


def test_only_the_head_of_each_subject_is_ready():
    a = enqueue("a", 1, 2, 3)
    b = enqueue("b", 1, 2)
    assert status(*a) == ["ready", "blocked", "blocked"]
    assert status(*b) == ["ready", "blocked"]
    assert gate("a") == (1, 2) and gate("b") == (1, 1)
    assert sorted(m.id for m in claim()) == [a[0], b[0]]


def test_the_successor_is_ready_when_the_ack_commits():
    a = enqueue("a", 1, 2, 3)
    [head] = claim()
    assert ack([head]) == {head.id}
    # No promotion, poll or sweep in between: the ack's own transaction moved it.
    assert status(*a) == [None, "ready", "blocked"]
    assert gate("a") == (1, 1)
    ack(claim())
    ack(claim())
    assert status(*a) == [None, None, None]
    assert gate("a") is None  # emptied: the row is gone


def test_a_batch_of_acks_moves_every_subject_it_touches():
    heads = [enqueue(f"s{n}", 1, 2) for n in range(30)]
    claimed = claim()
    assert len(claimed) == 30
    ack(claimed)
    assert all(status(*ids) == [None, "ready"] for ids in heads)


def test_a_retrying_head_holds_its_subject():
    a = enqueue("a", 1, 2)
    [head] = claim()
    assert broker.fail(head, head_runner(), failed()) == "retried"
    assert status(*a) == ["scheduled", "blocked"]
    assert gate("a") == (1, 1)
    make_due(a[0])
    broker.promote_due()
    assert status(*a) == ["ready", "blocked"]
    [again] = claim()
    assert again.id == a[0]
    ack([again])
    assert status(*a) == [None, "ready"]


def head_runner():
    from tests.subject_support import RUNNER

    return RUNNER


def test_a_dead_head_holds_its_subject_until_released():
    dead, after = ordered_dies.enqueue("a", 1, "t").id, enqueue("a", 2)[0]
    [head] = claim()
    assert broker.fail(head, head_runner(), failed()) == "failed"
    assert status(dead, after) == ["dead", "blocked"]
    assert gate("a") == (1, 1)
    assert [h.id for h in broker.holders([broker.GateRef("default", True, "a")])[
        broker.GateRef("default", True, "a")]] == [dead]
    assert broker.release_subjects([after], OPERATOR) == [dead]
    assert status(dead, after) == ["dead", "ready"]
    assert Message.objects.get(pk=dead).gate_mode == "skip"
    assert Attempt.objects.filter(message_id=dead, outcome="skipped").exists()
    assert gate("a") == (1, 0)


def test_requeueing_a_dead_head_runs_it_first():
    dead, after = ordered_dies.enqueue("a", 1, "t").id, enqueue("a", 2)[0]
    broker.fail(claim()[0], head_runner(), failed())
    assert broker.requeue_heads([after], OPERATOR) == [dead]
    assert status(dead, after) == ["ready", "blocked"]
    assert [m.id for m in claim()] == [dead]


def test_on_dead_skip_lets_the_subject_go_on():
    dead = ordered_dies_skipping.enqueue("a", 1, "t").id
    after = ordered_dies_skipping.enqueue("a", 2, "t").id
    broker.fail(claim()[0], head_runner(), failed())
    assert status(dead, after) == ["dead", "ready"]
    assert gate("a") == (1, 0)


def test_cancelling_the_head_or_a_blocked_message_keeps_the_counters():
    a = enqueue("a", 1, 2, 3, 4)
    assert broker.cancel([a[2]], OPERATOR) == [a[2]]
    assert gate("a") == (1, 2)
    assert broker.cancel([a[0]], OPERATOR) == [a[0]]
    assert status(*a) == [None, "ready", None, "blocked"]
    assert gate("a") == (1, 1)


def test_a_delayed_message_keeps_its_place_in_its_subject():
    first = ordered_step.using(delay=3600).enqueue("a", 1, "t").id
    second = enqueue("a", 2)[0]
    assert status(first, second) == ["scheduled", "blocked"]
    assert claim() == []
    make_due(first)
    broker.promote_due()
    ack(claim())
    assert status(first, second) == [None, "ready"]


def test_a_blocked_message_whose_time_has_not_come_is_promoted_to_scheduled():
    first = enqueue("a", 1)[0]
    later = ordered_step.using(delay=3600).enqueue("a", 2, "t").id
    assert status(first, later) == ["ready", "blocked"]
    ack(claim())
    assert status(first, later) == [None, "scheduled"]
    assert gate("a") == (1, 0)


def test_per_call_subject_and_enqueue_many_keep_call_order():
    handles = gated.ordered_step.using(subject="order:42").enqueue_many(
        [gated.ordered_step.call("ignored", seq, "t") for seq in range(5)])
    ids = [h.id for h in handles]
    assert ids == sorted(ids)
    assert status(*ids) == ["ready"] + ["blocked"] * 4
    assert gate("order:42") == (1, 4)


def test_enqueue_many_across_subjects():
    handles = gated.ordered_step.enqueue_many(
        [gated.ordered_step.call(key, seq, "t") for seq in range(3) for key in "bca"])
    by_key: dict[str, list[str | None]] = {}
    for handle, (seq, key) in zip(handles, [(s, k) for s in range(3) for k in "bca"],
                                  strict=True):
        by_key.setdefault(key, []).append(status(handle.id)[0])
        assert seq >= 0
    assert by_key == {key: ["ready", "blocked", "blocked"] for key in "abc"}


def test_a_subject_is_per_queue():
    here = enqueue("a", 1)[0]
    there = ordered_step.using(queue="other").enqueue("a", 1, "t").id
    assert status(here, there) == ["ready", "ready"]


def test_a_deduplicated_enqueue_into_a_subject_counts_it_once():
    first = ordered_step.using(dedup_key="d1").enqueue("a", 1, "t").id
    again = ordered_step.using(dedup_key="d1").enqueue("a", 1, "t").id
    assert again == first
    assert gate("a") == (1, 0)  # the refused insert's count was rolled back with it
    enqueue("a", 2)
    assert gate("a") == (1, 1)


def test_recovery_gives_a_lost_head_back_holding_its_subject():
    from tests.operator_support import claim_in_peer

    head, after = enqueue("a", 1, 2)
    claim_in_peer(head)  # claimed and started on a connection that is gone now
    assert broker.recover(liveness="connection") == [head]
    assert status(head, after) == ["ready", "blocked"]
    assert gate("a") == (1, 1)


def test_a_busy_subject_takes_one_place_in_line_and_starves_nobody():
    busy = enqueue("busy", *range(50))
    others = [enqueue(f"o{n}", 0)[0] for n in range(20)]
    ordered_step.using(priority=5).enqueue("urgent", 0, "t")
    first = claim(limit=10)
    # Heads by priority, then age: the urgent one, the busy subject's head (oldest), then
    # the others in enqueue order; never a second message of the busy subject.
    assert [m.gate_key for m in first[:2]] == ["urgent", "busy"]
    assert [m.id for m in first[2:]] == others[:8]
    ack(first)
    second = claim(limit=10)
    assert [m.id for m in second] == [busy[1], *others[8:17]]


def test_a_task_taking_the_context_derives_its_subject_from_the_callers_arguments():
    from django_mysqlq.context import TaskContext

    first = gated.ordered_with_context.enqueue("ctx", 1).id
    second = gated.ordered_with_context.enqueue(key="ctx", seq=2).id
    assert status(first, second) == ["ready", "blocked"]
    [head] = claim()
    assert head.id == first and head.gate_key == "ctx"
    assert TaskContext.of(head).subject == "ctx"
