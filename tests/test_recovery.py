"""Recovery: claims of vanished owners go back to the queue; live ones are left alone."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_mysqlq import broker
from django_mysqlq.messages import AttemptResult, Runner
from django_mysqlq.models import Attempt, Message
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

RUNNER = Runner(worker_id="w", host="h", pid=1, thread="t")


def in_thread(function, *args, close=True):
    """Run ``function`` on its own database connection (a peer), closing it if asked."""
    box: dict = {}

    def run():
        try:
            box["value"] = function(*args)
        finally:
            if close:
                connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return box["value"]


def recover_until_found(**kwargs):
    """The server drops a closed connection from its process list within moments: poll."""
    return wait_for(lambda: broker.recover(**kwargs), timeout=5, message="a recovery")


def peer_claim(limit=10, worker="peer"):
    return broker.claim(["default"], limit, worker, lease_seconds=30)


def test_claims_of_a_closed_connection_are_recovered_as_lost():
    handles = tasks.record.enqueue_many([["a"], ["b"]])
    claimed = in_thread(peer_claim)  # the peer's connection closes: it "died"
    assert len(claimed) == 2
    recovered = recover_until_found()
    assert sorted(recovered) == sorted(h.id for h in handles)
    for handle in handles:
        row = Message.objects.get(pk=handle.id)
        assert (row.status, row.claim_token, row.owner_connection) == ("ready", None, None)
        assert (row.attempts, row.losses) == (0, 1)  # never started: attempt given back
        assert "WorkerLost" in row.last_error
        [attempt] = Attempt.objects.for_message(handle.id)
        assert attempt.outcome == "lost"
        assert attempt.error_class == "WorkerLost"
        assert "is gone" in attempt.error_message
        assert "had not started" in attempt.error_message
        assert attempt.worker_id == "peer"
        assert attempt.connection_id == claimed[0].connection_id


def test_claims_of_a_live_connection_are_left_alone():
    tasks.record.enqueue_many([["a"], ["b"]])
    peer_claim()  # this thread's connection stays open
    assert broker.recover() == []
    assert Message.objects.claimed().count() == 2


def test_expired_lease_is_recovered_even_with_a_live_owner():
    handle = tasks.record.enqueue("a")
    peer_claim()
    Message.objects.filter(pk=handle.id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert broker.recover() == [handle.id]
    assert "lease expired" in Attempt.objects.get(message_id=handle.id).error_message


def test_claim_from_before_a_server_restart_is_recovered():
    handle = tasks.record.enqueue("a")
    peer_claim()
    _, server_start = broker.connection_identity()
    # Same connection id, but stamped by a server that started earlier: ids were reused.
    Message.objects.filter(pk=handle.id).update(owner_server_start=server_start - 3600)
    assert broker.recover() == [handle.id]
    assert "restarted" in Attempt.objects.get(message_id=handle.id).error_message


def test_lease_mode_ignores_connections_and_waits_for_the_lease():
    handle = tasks.record.enqueue("a")
    in_thread(peer_claim)
    assert broker.recover(liveness="lease") == []
    Message.objects.filter(pk=handle.id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert broker.recover(liveness="lease") == [handle.id]


def started_peer_claim():
    """A peer that claims and starts its messages (and records the starts)."""
    claimed = peer_claim()
    broker.mark_started([(m, timezone.now()) for m in claimed])
    return claimed


def test_a_message_lost_on_its_last_attempt_becomes_dead():
    handle = tasks.record.enqueue("a")
    Message.objects.filter(pk=handle.id).update(max_attempts=1)
    in_thread(started_peer_claim)
    assert recover_until_found() == [handle.id]
    row = Message.objects.get(pk=handle.id)
    assert row.status == "dead"
    attempt = Attempt.objects.get(message_id=handle.id)
    assert attempt.outcome == "failed"
    assert attempt.payload == row.payload  # kept for replay


def test_only_one_sweeper_at_a_time():
    tasks.record.enqueue("a")
    in_thread(peer_claim)
    holder_ready, release = threading.Event(), threading.Event()

    def hold_lock():
        with connection.cursor() as cursor:
            cursor.execute(broker.RECOVERY_LOCK_SQL)
            holder_ready.set()
            release.wait(10)
            cursor.execute(broker.RECOVERY_UNLOCK_SQL)
        connections.close_all()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert holder_ready.wait(10)
        assert broker.recover() == []
        assert Message.objects.claimed().count() == 1
    finally:
        release.set()
        holder.join()
    assert len(recover_until_found()) == 1


def test_a_late_ack_never_deletes_a_recovered_message():
    handle = tasks.record.enqueue("a")
    [message] = in_thread(peer_claim)
    recover_until_found()
    result = AttemptResult(started_at=timezone.now(), result=1)
    assert broker.ack(message, RUNNER, result) is False
    row = Message.objects.get(pk=handle.id)
    assert row.status == "ready"  # still queued for its re-run
    outcomes = list(Attempt.objects.for_message(handle.id).values_list("outcome", flat=True))
    assert outcomes == ["lost", "succeeded"]


def test_a_late_failure_never_touches_a_reclaimed_message():
    handle = tasks.record.enqueue("a")
    [old] = in_thread(peer_claim)
    recover_until_found()
    [new] = peer_claim(worker="second")
    failure = AttemptResult(started_at=timezone.now(), error_class="E", error_message="x")
    broker.fail(old, RUNNER, failure)
    row = Message.objects.get(pk=handle.id)
    assert (row.status, row.claim_token, row.worker_id) == ("claimed", new.claim_token, "second")


def test_stale_workers_are_marked_stopped(settings):
    broker.register_worker("stale", "h", 1, ["default"], 1)
    broker.register_worker("fresh", "h", 2, ["default"], 1)
    from django_mysqlq.models import Worker

    Worker.objects.filter(pk="stale").update(
        last_heartbeat=timezone.now() - dt.timedelta(minutes=5))
    assert broker.mark_stale_workers() == 1
    assert Worker.objects.get(pk="stale").stopped_at is not None
    assert Worker.objects.get(pk="fresh").stopped_at is None


def test_ack_many_deletes_only_what_is_still_ours_and_traces_every_run():
    handles = tasks.record.enqueue_many([["a"], ["b"], ["c"]])
    mine = peer_claim(limit=2)
    [lost] = in_thread(peer_claim)  # claimed by a connection that then closed
    recover_until_found()
    result = AttemptResult(started_at=timezone.now(), result=1)
    owned = broker.ack_many([(m, RUNNER, result) for m in [*mine, lost]])
    assert owned == {m.id for m in mine}
    assert set(Message.objects.values_list("pk", flat=True)) == {lost.id}
    assert Message.objects.get(pk=lost.id).status == "ready"
    assert Attempt.objects.succeeded().count() == 3
    assert {h.id for h in handles} == {*owned, lost.id}


def test_a_worker_keeping_the_lock_is_the_one_sweeper_until_it_disconnects():
    assert broker.recover(keep_lock=True) == []
    assert broker.is_recovery_leader()
    assert in_thread(broker.recover) == []  # a peer can't sweep meanwhile...
    tasks.record.enqueue("a")
    in_thread(peer_claim)
    assert len(recover_until_found()) == 1  # ...while the leader sweeps without asking again
    connection.close()  # the leader goes: its lock with it
    tasks.record.enqueue("b")
    assert len(in_thread(peer_claim)) == 2  # "a" again, and "b"
    assert len(wait_for(lambda: in_thread(broker.recover), timeout=5,
                        message="a new sweeper")) == 2
