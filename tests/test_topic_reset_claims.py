"""A topic group reset and the members claiming meanwhile, against the real MariaDB (no
worker process: a member's claim is called the way a worker calls it).

The reset used to commit the position's move first and cancel the group's waiting
deliveries after, ``OPERATOR_CHUNK`` at a time, each chunk its own transaction. Between
the move and the cancel a member claimed the waiting deliveries (lowest ids first: the
very ones about to be cancelled), so after a reset backwards their offsets ran twice;
and each cancelled head of a key freed its slot and promoted the key's next *old*
blocked delivery, which a member could claim before the next chunk cancelled it (the key
then ran an old offset before the new deliveries of the earlier ones). The waiting
deliveries are now cancelled in the reset's own transaction, all together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from django_mysqlq import broker
from django_mysqlq.broker import operate, topic_reset
from django_mysqlq.messages import AttemptResult
from django_mysqlq.models import Attempt, Gate, Message, MessageStatus, TopicDelivery
from tests.operator_support import OPERATOR, RUNNER
from tests.topic_ops_support import claim, group, publish

pytestmark = pytest.mark.django_db(transaction=True)


def claiming_after(monkeypatch: Any, module: Any, made: broker.GroupSpec,
                   claimed: list[int]) -> None:
    """Each transaction ``module`` runs is followed, once committed, by a member's claim
    of whatever of the group is ready (its ids go to ``claimed``)."""
    real: Callable[..., Any] = module.in_transaction

    def then_claim(alias: str, body: Callable[[Any], Any]) -> Any:
        value = real(alias, body)
        claimed.extend(message.id for message in claim(made, 100))
        return value

    monkeypatch.setattr(module, "in_transaction", then_claim)


def offsets_of(ids: list[int]) -> list[int]:
    return sorted(TopicDelivery.objects.filter(message_id__in=ids)
                  .values_list("offset", flat=True))


def test_a_member_claims_no_waiting_delivery_once_the_reset_commits(monkeypatch) -> None:
    made = group("orders", "billing")
    publish("orders", 5)
    broker.pump(made, batch=100, window=100)
    claimed: list[int] = []
    claiming_after(monkeypatch, topic_reset, made, claimed)
    claiming_after(monkeypatch, operate, made, claimed)
    done = broker.reset_group("orders", "billing", broker.ResetTarget(to_offset=2), OPERATOR)
    # Before: the member right after the move claimed offsets 1..5, and the reset
    # cancelled none of them (0 waiting deliveries cancelled).
    assert offsets_of(claimed) == []
    assert (done.old_position, done.new_position, done.cancelled) == (5, 1, 5)
    assert not Message.objects.filter(queue=made.queue).exists()
    assert Attempt.objects.filter(task_name=made.task_name, outcome="cancelled",
                                  error_message=topic_reset.RESET_NOTE).count() == 5
    # Each offset past the new position comes once: 2..5 again, nothing else waits.
    monkeypatch.undo()
    assert broker.pump(made, batch=100, window=100) == 4
    assert sorted(message.id for message in claim(made, 100)) == sorted(
        Message.objects.filter(queue=made.queue).values_list("id", flat=True))
    assert Message.objects.filter(queue=made.queue).count() == 4


def test_a_reset_promotes_no_old_blocked_delivery_of_a_key(monkeypatch) -> None:
    made = group("orders", "billing")
    publish("orders", 3, key="k")
    broker.pump(made, batch=100, window=100)
    # The key's head failed and waits for its retry (it holds the key's slot); offsets
    # 2 and 3 wait blocked behind it.
    [head] = claim(made, 1)
    broker.fail(head, RUNNER, AttemptResult(
        started_at=broker.database_now(), error_class="RuntimeError",
        error_message="handler broke", traceback="..."), retry=True, retry_in=3600)
    assert sorted(Message.objects.filter(queue=made.queue).values_list("status", flat=True)
                  ) == [MessageStatus.BLOCKED, MessageStatus.BLOCKED, MessageStatus.SCHEDULED]
    monkeypatch.setattr(operate, "OPERATOR_CHUNK", 1)
    claimed: list[int] = []
    claiming_after(monkeypatch, topic_reset, made, claimed)
    claiming_after(monkeypatch, operate, made, claimed)
    done = broker.reset_group("orders", "billing", broker.ResetTarget(edge="earliest"),
                              OPERATOR)
    # Before: cancelling the head freed the key's slot and promoted offset 2's old
    # delivery, which the member claimed before the next chunk could cancel it.
    assert offsets_of(claimed) == []
    assert (done.old_position, done.new_position, done.cancelled) == (3, 0, 3)
    assert not Message.objects.filter(queue=made.queue).exists()
    assert not Gate.objects.filter(queue=made.queue).exists()  # nothing left in the key
    assert Attempt.objects.filter(task_name=made.task_name, outcome="cancelled",
                                  error_message=topic_reset.RESET_NOTE).count() == 3
    # The key's new deliveries run in offset order: 1 first, 2 and 3 behind it.
    monkeypatch.undo()
    assert broker.pump(made, batch=100, window=100) == 3
    [first] = claim(made, 100)
    assert offsets_of([first.id]) == [1]
