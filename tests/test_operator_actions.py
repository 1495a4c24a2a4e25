"""Operator actions in the broker: what they change, what they record, what they refuse."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection

from django_mysqlq import broker, ops
from django_mysqlq.broker import operate
from django_mysqlq.models import Attempt, Message
from tests.conftest import wait_for
from tests.operator_support import OPERATOR, claim_in_peer, claim_only, make_dead
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def last_history(message_id: int) -> Attempt:
    return Attempt.objects.for_message(message_id).last()


def test_requeue_makes_a_dead_message_ready_and_records_who():
    dead = make_dead()
    assert broker.requeue([dead], OPERATOR) == [dead]
    row = Message.objects.get(pk=dead)
    assert (row.status, row.attempts) == ("ready", 1)  # attempts kept: not a full set
    record = last_history(dead)
    assert (record.outcome, record.actor, record.error_message) == (
        "requeued", "test:alice", "requeued")


def test_requeue_with_reset_gives_a_full_set_of_attempts():
    dead = make_dead()
    broker.requeue([dead], OPERATOR, reset_attempts=True)
    assert Message.objects.get(pk=dead).attempts == 0


def test_requeue_makes_a_scheduled_message_ready_now():
    later = tasks.record.using(delay=3600).enqueue("later")
    assert broker.requeue([later.id], OPERATOR) == [later.id]
    row = Message.objects.get(pk=later.id)
    assert row.status == "ready"
    assert row.run_at <= broker.database_now()


def test_retry_dead_only_touches_dead_messages():
    ready = tasks.record.enqueue("r")
    assert broker.requeue([ready.id], OPERATOR, statuses=("dead",)) == []
    assert not Attempt.objects.filter(message_id=ready.id).exists()
    with pytest.raises(ValueError, match="Only ready, scheduled or dead"):
        broker.requeue([ready.id], OPERATOR, statuses=("claimed",))


def test_actions_never_touch_a_claimed_message():
    handle = tasks.record.enqueue("running")
    claimed = claim_only(handle.id)
    assert broker.requeue([handle.id], OPERATOR, reset_attempts=True) == []
    assert broker.cancel([handle.id], OPERATOR) == []
    assert broker.set_priority([handle.id], 50, OPERATOR) == []
    row = Message.objects.get(pk=handle.id)
    assert (row.status, row.claim_token, row.priority, row.attempts) == (
        "claimed", claimed.claim_token, 0, 1)
    assert not Attempt.objects.filter(message_id=handle.id).exists()


def test_cancel_deletes_and_keeps_the_payload_for_replay():
    handle = tasks.record.enqueue("gone", value=7)
    assert broker.cancel([handle.id], OPERATOR) == [handle.id]
    assert not Message.objects.filter(pk=handle.id).exists()
    record = last_history(handle.id)
    assert record.outcome == "cancelled" and record.actor == "test:alice"
    assert handle.state().status == "cancelled" and handle.state().is_finished
    assert json.loads(record.payload) == {"args": ["gone"], "kwargs": {"value": 7}}


def test_change_priority_records_the_old_one_and_validates():
    handle = tasks.record.enqueue("p")
    assert broker.set_priority([handle.id], 42, OPERATOR) == [handle.id]
    assert Message.objects.get(pk=handle.id).priority == 42
    record = last_history(handle.id)
    assert (record.outcome, record.priority, record.error_message) == (
        "priority", 0, "priority set to 42")
    with pytest.raises(ValueError, match="-100 to 100"):
        broker.set_priority([handle.id], 101, OPERATOR)


def test_bulk_actions_work_in_chunks(monkeypatch):
    monkeypatch.setattr(operate, "OPERATOR_CHUNK", 3)
    handles = tasks.record.enqueue_many([[f"m{i}"] for i in range(8)])
    ids = [h.id for h in handles]
    assert sorted(broker.set_priority(ids, 5, OPERATOR)) == sorted(ids)
    assert Message.objects.filter(priority=5).count() == 8
    assert Attempt.objects.filter(outcome="priority").count() == 8


def test_release_refuses_a_claim_whose_connection_is_alive():
    handle = tasks.record.enqueue("live")
    claim_only(handle.id)  # this test's own connection: alive
    assert broker.release_stuck([handle.id], OPERATOR) == {}
    assert Message.objects.get(pk=handle.id).status == "claimed"
    assert [s.id for s in broker.stuck_messages()] == []


def test_release_frees_a_claim_whose_owner_connection_is_gone():
    handle = tasks.record.enqueue("orphan")
    claim_in_peer(handle.id)
    stuck = wait_for(broker.stuck_messages, timeout=5, message="the peer to vanish")
    assert [(s.id, s.releasable) for s in stuck] == [(handle.id, True)]
    released = broker.release_stuck([handle.id], OPERATOR)
    assert list(released) == [handle.id] and "is gone" in released[handle.id]
    row = Message.objects.get(pk=handle.id)
    assert (row.status, row.attempts, row.owner_connection) == ("ready", 1, None)
    record = last_history(handle.id)
    assert (record.outcome, record.actor) == ("released", "test:alice")


def test_release_of_a_last_attempt_makes_it_dead():
    handle = tasks.stress_step.enqueue("last", 0)  # max_attempts=1
    claim_in_peer(handle.id)
    wait_for(broker.stuck_messages, timeout=5, message="the peer to vanish")
    broker.release_stuck([handle.id], OPERATOR)
    assert Message.objects.get(pk=handle.id).status == "dead"
    assert last_history(handle.id).outcome == "failed"


def test_an_overrunning_message_with_a_live_worker_is_stuck_but_not_releasable():
    handle = tasks.overruns.enqueue("slow")  # timeout=0.2
    claim_only(handle.id)
    stuck = wait_for(broker.stuck_messages, timeout=5, message="the overrun")
    assert [(s.id, s.releasable) for s in stuck] == [(handle.id, False)]
    assert broker.release_stuck([handle.id], OPERATOR) == {}
    assert Message.objects.get(pk=handle.id).status == "claimed"


def test_an_expired_lease_is_stuck_and_releasable_even_with_a_live_connection():
    handle = tasks.record.enqueue("expired")
    claim = broker.claim(["default"], 1, "w", lease_seconds=0.001)
    assert claim[0].id == handle.id
    stuck = wait_for(broker.stuck_messages, timeout=5, message="the lease to run out")
    assert stuck[0].reason == "lease expired without a heartbeat"
    assert handle.id in broker.release_stuck([handle.id], OPERATOR)


def test_replay_enqueues_a_copy_of_a_finished_message():
    handle = tasks.record.enqueue("again", value=3)
    broker.cancel([handle.id], OPERATOR)
    source = last_history(handle.id)
    new_id = ops.replay(source.pk, OPERATOR)
    copy = Message.objects.get(pk=new_id)
    assert (copy.task_name, copy.status, copy.queue) == ("tests.testapp.tasks.record", "ready",
                                                         "default")
    assert json.loads(copy.payload) == {"args": ["again"], "kwargs": {"value": 3}}
    assert copy.max_attempts == tasks.record.max_attempts
    record = last_history(new_id)
    assert record.outcome == "replayed" and f"history row {source.pk}" in record.error_message


def test_replay_refuses_a_row_without_arguments():
    dead = make_dead()
    broker.requeue([dead], OPERATOR)
    requeued = last_history(dead)
    with pytest.raises(ValueError, match="only the final row"):
        ops.replay(requeued.pk, OPERATOR)
    with pytest.raises(LookupError, match="does not exist"):
        ops.replay(10**12, OPERATOR)


def test_pause_and_resume_are_recorded():
    broker.set_paused("emails", True, OPERATOR)
    assert broker.paused_queues() == {"emails"}
    broker.set_paused("emails", False, OPERATOR)
    assert broker.paused_queues() == set()


def test_purge_deletes_old_history_in_batches_oldest_first():
    for label in "abcde":
        make_dead(label=label)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_attempt SET finished_at = finished_at - INTERVAL 40 DAY "
                       "WHERE error_message IN ('boom a', 'boom b', 'boom c')")
    cutoff = broker.database_now() - dt.timedelta(days=30)
    assert broker.count_history_before(cutoff) == 3
    assert broker.purge_history_batch(cutoff, 2) == 2
    assert broker.purge_history_batch(cutoff, 2) == 1
    assert broker.purge_history_batch(cutoff, 2) == 0
    assert Attempt.objects.count() == 2
