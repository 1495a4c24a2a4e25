"""Concurrency limits at the broker: at most N messages of a key hold a slot; the rest wait
blocked and move up as slots free; a retry gives its slot up and takes one again when due."""

from __future__ import annotations

import pytest

from django_mysqlq import InvalidTaskOptions, broker, queue_task
from django_mysqlq.broker import Operator
from tests.subject_support import RUNNER, ack, claim, failed, gate, make_due, status
from tests.testapp.gated import LIMIT, limited_step, ordered_step

pytestmark = pytest.mark.django_db(transaction=True)


def enqueue(key: str, count: int) -> list[int]:
    return [limited_step.enqueue(key, seq, "t").id for seq in range(count)]


def test_at_most_the_limit_is_ready_and_the_rest_wait():
    ids = enqueue("k", 5)
    assert status(*ids) == ["ready"] * LIMIT + ["blocked"] * (5 - LIMIT)
    assert gate("k", ordered=False) == (LIMIT, 5 - LIMIT)
    claimed = claim()
    assert len(claimed) == LIMIT
    ack(claimed[:1])
    assert status(*ids)[LIMIT] == "ready"  # the slot went to the oldest waiting
    assert gate("k", ordered=False) == (LIMIT, 5 - LIMIT - 1)


def test_a_retry_gives_its_slot_up_and_takes_one_again_when_due():
    ids = enqueue("k", 3)
    first, second = claim()
    assert broker.fail(first, RUNNER, failed()) == "retried"
    # Waiting for its backoff it holds no slot: the third runs meanwhile.
    assert status(*ids) == ["scheduled", "claimed", "ready"]
    assert gate("k", ordered=False) == (2, 0)
    make_due(ids[0])
    broker.promote_due()
    assert status(ids[0]) == ["blocked"]  # both slots are taken
    ack([second])
    assert status(ids[0]) == ["ready"]
    assert gate("k", ordered=False) == (2, 0)


def test_a_due_retry_with_a_free_slot_is_ready_at_once():
    ids = enqueue("k", 1)
    [only] = claim()
    broker.fail(only, RUNNER, failed())
    assert gate("k", ordered=False) is None  # nothing holds or waits: the row is gone
    make_due(ids[0])
    broker.promote_due()
    assert status(*ids) == ["ready"]
    assert gate("k", ordered=False) == (1, 0)


def test_a_delayed_limited_message_takes_its_slot_when_due():
    delayed = limited_step.using(delay=3600).enqueue("k", 0, "t").id
    assert status(delayed) == ["scheduled"]
    assert gate("k", ordered=False) is None
    make_due(delayed)
    broker.promote_due()
    assert status(delayed) == ["ready"]


def test_a_dead_limited_message_frees_its_slot():
    ids = enqueue("k", 3)
    first, _ = claim()
    Message = __import__("django_mysqlq.models", fromlist=["Message"]).Message
    Message.objects.filter(pk=first.id).update(max_attempts=1)
    broker.fail(first, RUNNER, failed(), retry=False)
    assert status(*ids) == ["dead", "claimed", "ready"]


def test_a_task_wide_limit_and_a_per_call_key():
    @queue_task(name="tests.limited.whole", concurrency_limit=1)
    def whole(n: int) -> None: ...

    one, two = whole.enqueue(1).id, whole.enqueue(2).id
    assert status(one, two) == ["ready", "blocked"]
    other = whole.using(concurrency_key="elsewhere").enqueue(3).id
    assert status(other) == ["ready"]


def test_requeueing_a_dead_limited_message_waits_for_a_slot():
    ids = enqueue("k", 3)
    first, _ = claim()
    broker.fail(first, RUNNER, failed(), retry=False)
    assert status(*ids) == ["dead", "claimed", "ready"]
    assert broker.requeue([ids[0]], Operator("cli:test")) == [ids[0]]
    assert status(ids[0]) == ["blocked"]


def test_bad_options_are_refused_with_what_to_do():
    with pytest.raises(InvalidTaskOptions, match="concurrency_limit must be an integer"):
        queue_task(name="tests.limited.zero", concurrency_limit=0)(lambda k: None)
    with pytest.raises(InvalidTaskOptions, match="needs concurrency_limit"):
        queue_task(name="tests.limited.nokey", concurrency_key="k")(lambda k: None)
    with pytest.raises(InvalidTaskOptions, match="one gate"):
        queue_task(name="tests.limited.both", ordered_by="k", concurrency_limit=2)(
            lambda k: None)
    with pytest.raises(InvalidTaskOptions, match="names no argument"):
        queue_task(name="tests.limited.typo", concurrency_key="kee", concurrency_limit=2)(
            lambda key: None)
    with pytest.raises(InvalidTaskOptions, match="on_dead must be"):
        queue_task(name="tests.limited.ondead", ordered_by="k", on_dead="drop")(
            lambda k: None)
    for on_dead in ("hold", "skip"):  # a dead limited message frees its slot: no choice
        with pytest.raises(InvalidTaskOptions, match=f"on_dead='{on_dead}' means nothing "
                           "with concurrency_limit.*Leave on_dead out"):
            queue_task(name=f"tests.limited.{on_dead}", concurrency_key="k",
                       concurrency_limit=2, on_dead=on_dead)(lambda k: None)
        with pytest.raises(InvalidTaskOptions, match="means nothing with concurrency_limit"):
            queue_task(name=f"tests.limited.whole.{on_dead}", concurrency_limit=1,
                       on_dead=on_dead)(lambda k: None)
    with pytest.raises(InvalidTaskOptions, match="can't also take an ordered subject"):
        limited_step.using(subject="s")
    with pytest.raises(InvalidTaskOptions, match="needs a task declared with"):
        ordered_step.using(concurrency_key="s")
    with pytest.raises(InvalidTaskOptions, match="not both"):
        ordered_step.using(concurrency_key="s", subject="s")
    with pytest.raises(InvalidTaskOptions, match="non-empty string"):
        limited_step.enqueue("", 1, "t")
    with pytest.raises(InvalidTaskOptions, match="non-empty string"):
        limited_step.enqueue("x" * 256, 1, "t")
    with pytest.raises(InvalidTaskOptions, match="is None or missing"):
        limited_step.enqueue(None, 1, "t")
    with pytest.raises(InvalidTaskOptions, match="non-empty string"):
        limited_step.enqueue(1.5, 1, "t")
    assert not Message_count()


def Message_count() -> int:
    from django_mysqlq.models import Message

    return Message.objects.count()


def test_an_integer_key_is_its_string():
    one = limited_step.enqueue(42, 0, "t").id
    assert status(one) == ["ready"]
    assert gate("42", ordered=False) == (1, 0)
