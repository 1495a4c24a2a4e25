"""The pump that claims for its member (``broker.pump_claiming``), without workers: while
nothing of the group waits it makes only the deliveries the member takes, inserted
claimed by it (a keyed one behind its key's earlier delivery stays blocked); while
deliveries wait it pumps by the window and claims nothing; what it claimed acks, and is
recovered, like any claim."""

from __future__ import annotations

import json

import pytest

from django_mysqlq import Topic, broker
from django_mysqlq.messages import AttemptResult
from django_mysqlq.models import Message, TopicDelivery
from tests.operator_support import RUNNER
from tests.topic_ops_support import group, holding_topic_row

pytestmark = pytest.mark.django_db(transaction=True)


def claim_for(count: int) -> broker.PumpClaim:
    return broker.PumpClaim(count, RUNNER.worker_id, lease_seconds=30)


def offset_of(message_id: int) -> int:
    return TopicDelivery.objects.get(message_id=message_id).offset


def test_a_member_with_room_gets_its_deliveries_claimed_by_the_pump() -> None:
    feed = Topic("claimfeed")
    made = group("claimfeed", "billing")
    feed.publish_many([{"n": n} for n in range(10)])
    broker.sequence("claimfeed")
    pumped, claimed = broker.pump_claiming(made, 500, 1000, claim_for(4))
    assert (pumped.made, pumped.behind) == (4, True)
    # Only what it takes is pumped, in offset order, each claimed once by this member.
    assert [offset_of(m.id) for m in claimed] == [1, 2, 3, 4]
    assert [json.loads(m.payload)["args"][0]["n"] for m in claimed] == [0, 1, 2, 3]
    assert broker.position("claimfeed", "billing") == 4
    rows = Message.objects.filter(queue=made.queue)
    assert {(r.status, r.attempts, r.worker_id) for r in rows} == {
        ("claimed", 1, RUNNER.worker_id)}
    assert len({m.claim_token for m in claimed}) == 1 and claimed[0].attempt == 1
    assert all(r.lease_expires_at and r.claimed_at and r.started_at is None for r in rows)
    # It acks like a claimed message: the row goes, its history stays.
    assert broker.ack(claimed[0], RUNNER, AttemptResult(started_at=broker.database_now()))
    assert Message.objects.filter(queue=made.queue).count() == 3
    # Another group of the topic gets every message too.
    other = group("claimfeed", "audit")
    pumped, claimed = broker.pump_claiming(other, 500, 1000, claim_for(100))
    assert pumped.made == 10 and len(claimed) == 10
    assert broker.position("claimfeed", "audit") == 10


def test_while_deliveries_wait_the_pump_fills_the_window_and_claims_nothing() -> None:
    feed = Topic("claimwait")
    made = group("claimwait", "billing")
    feed.publish_many([{"n": n} for n in range(10)])
    broker.sequence("claimwait")
    assert broker.pump(made, batch=3, window=100) == 3  # three ready deliveries wait
    pumped, claimed = broker.pump_claiming(made, 4, 100, claim_for(2))
    assert (pumped.made, claimed) == (4, [])
    assert set(Message.objects.filter(queue=made.queue).values_list("status", flat=True)
               ) == {"ready"}
    # No room (count 0): the window's rules, as without a claim.
    pumped, claimed = broker.pump_claiming(made, 4, 100, claim_for(0))
    assert (pumped.made, claimed) == (3, [])
    assert broker.position("claimwait", "billing") == 10


def test_keyed_deliveries_behind_their_key_stay_blocked_and_the_order_holds() -> None:
    feed = Topic("claimkeys")
    made = group("claimkeys", "billing", on_dead="hold")
    feed.publish_many([{"n": n} for n in range(4)], keys=["a", "a", "b", "a"])
    broker.sequence("claimkeys")
    pumped, claimed = broker.pump_claiming(made, 500, 1000, claim_for(3))
    # Three pumped: a1 and b claimed, a2 blocked behind a1 (one claim left unused).
    assert pumped.made == 3
    assert [offset_of(m.id) for m in claimed] == [1, 3]
    blocked = Message.objects.get(queue=made.queue, status="blocked")
    assert offset_of(blocked.id) == 2
    # Acking a1 readies a2 (the key's next, by id); a claim then takes it.
    assert broker.ack(claimed[0], RUNNER, AttemptResult(started_at=broker.database_now()))
    taken = broker.claim([made.queue], 10, RUNNER.worker_id, lease_seconds=30)
    assert [offset_of(m.id) for m in taken] == [2]


def test_claimed_deliveries_of_a_vanished_member_are_recovered() -> None:
    feed = Topic("claimlost")
    made = group("claimlost", "billing")
    feed.publish_many([{"n": n} for n in range(3)])
    broker.sequence("claimlost")
    _, claimed = broker.pump_claiming(
        made, 500, 1000, broker.PumpClaim(3, RUNNER.worker_id, lease_seconds=0.001))
    assert len(claimed) == 3
    Message.objects.filter(queue=made.queue).update(owner_connection=None)  # lease only
    assert sorted(broker.recover()) == sorted(m.id for m in claimed)
    assert set(Message.objects.filter(queue=made.queue).values_list("status", flat=True)
               ) == {"ready"}


def test_the_worker_side_reserves_room_half_a_batch_ahead_and_keeps_queue_order() -> None:
    """PumpClaimer: room up to the claim batch, from half a batch free; none for a group
    a task queue precedes in the worker's claim order, or a paused one (-1: the window's
    rules); what the pump did not claim goes back to the --max-tasks budget."""
    from types import SimpleNamespace

    from django_mysqlq.worker.budget import TaskBudget
    from django_mysqlq.worker.pumpclaim import PumpClaimer

    added: list[object] = []
    worker = SimpleNamespace(
        id="w", _active=["group:a", "group:b", "default", "group:c"],
        options=SimpleNamespace(claim_batch=100, concurrency=8),
        holdings=SimpleNamespace(in_flight=0, add=added.extend),
        topics=SimpleNamespace(specs=[SimpleNamespace(queue=q)
                                      for q in ("group:a", "group:b", "group:c")]),
        gate=SimpleNamespace(solo_pending=False), budget=TaskBudget(150),
        _over_memory=lambda: False)
    claimer = PumpClaimer(worker)  # type: ignore[arg-type]
    assert claimer.pump_room("group:a") == 100
    claimer.pump_took([], 100)  # nothing claimed: all of it back
    assert claimer.pump_room("group:b") == 100  # groups only before it
    claimer.pump_took(["m"] * 30, 100)  # type: ignore[list-item]
    assert added == ["m"] * 30
    assert claimer.pump_room("group:c") == -1  # "default" is claimed first
    assert claimer.pump_room("group:paused") == -1
    worker.holdings.in_flight = 60  # more than the threads, under half a batch free
    assert claimer.pump_room("group:a") == 0
    worker.holdings.in_flight = 50
    assert claimer.pump_room("group:a") == 50
    claimer.pump_took([], 50)
    worker.holdings.in_flight = 0
    assert claimer.pump_room("group:a") == 100 and claimer.pump_room("group:b") == 20


def test_a_woken_member_stamps_and_claims_a_new_message_in_one_transaction() -> None:
    """Woken from its park by a publish, a member doesn't look first: its pump stamps the
    topic's new message and claims its delivery in one transaction."""
    feed = Topic("wokenfeed")
    made = group("wokenfeed", "billing")
    feed.publish({"n": 1})
    pumped, claimed = broker.pump_claiming(made, 500, 1000, claim_for(4), sequence=True,
                                           woken=True)
    assert (pumped.made, pumped.busy) == (1, False)
    assert [offset_of(m.id) for m in claimed] == [1]
    assert broker.position("wokenfeed", "billing") == 1
    assert broker.last_offset("wokenfeed") == 1


def test_a_woken_member_claims_the_ready_deliveries_first_and_keeps_the_window() -> None:
    """A wake-up from another member's pump (or a retry come due) finds deliveries of the
    group ready: the woken pump takes nothing new ahead of them, and pumps by the window
    as a look says (the review's case: it filled the member's room with newer offsets)."""
    feed = Topic("wokenwait")
    made = group("wokenwait", "billing")
    feed.publish_many([{"n": n} for n in range(10)])
    broker.sequence("wokenwait")
    assert broker.pump(made, batch=3, window=4) == 3  # three ready deliveries wait
    pumped, claimed = broker.pump_claiming(made, 500, 4, claim_for(5), sequence=True,
                                           woken=True)
    assert claimed == []
    assert pumped.made == 1  # the window's room, as without a wake-up
    assert set(Message.objects.filter(queue=made.queue).values_list("status", flat=True)
               ) == {"ready"}
    assert broker.position("wokenwait", "billing") == 4


def woken_pump_while_held(made: broker.GroupSpec) -> tuple[broker.Pumped, list]:
    """A woken member's pump while another session holds its topic's row."""
    stranger = holding_topic_row(made.topic)
    try:
        return broker.pump_claiming(made, 500, 1000, claim_for(10), sequence=True,
                                    woken=True)
    finally:
        stranger.release()


def test_a_woken_member_pumps_what_is_sequenced_while_another_holds_the_topic_row() -> None:
    """Another member stamping the topic (its row held) doesn't send a woken member to
    wait: it claims the offsets already given, in order, and leaves the new ones."""
    feed = Topic("wokenheld")
    made = group("wokenheld", "billing")
    feed.publish_many([{"n": n} for n in range(3)])
    broker.sequence("wokenheld")
    feed.publish({"n": 3})  # not stamped yet
    pumped, claimed = woken_pump_while_held(made)
    assert [offset_of(m.id) for m in claimed] == [1, 2, 3]
    assert pumped.made == 3 and broker.last_offset("wokenheld") == 3
    # With nothing sequenced left and the row still held, it says the row is busy.
    pumped, claimed = woken_pump_while_held(made)
    assert (pumped.made, pumped.busy, claimed) == (0, True, [])
