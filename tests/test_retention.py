"""Retention of dead messages and worker rows: by queuepurge, and by the recovery leader.

A dead message's age is the time it died (its ``run_at`` from then on); a purged one
leaves a ``cancelled`` history row with its arguments, like an operator's cancel. Worker
rows go once the worker stopped (or was marked stale) and has been silent long enough.
"""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_mysqlq import broker, payload
from django_mysqlq.messages import AttemptResult
from django_mysqlq.models import Attempt, Message, Worker
from django_mysqlq.worker import retention
from tests.conftest import wait_for
from tests.operator_support import OPERATOR, RUNNER, claim_in_peer, claim_only, make_dead
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

DAY = 86400


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def age_dead(message_id: int, days: float) -> None:
    """Make a dead message look as if it died ``days`` ago."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_message SET run_at = UTC_TIMESTAMP(6) - INTERVAL %s "
                       "SECOND WHERE id = %s AND status = 'dead'", [int(days * DAY), message_id])


def seconds_since_run_at(message_id: int) -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT TIMESTAMPDIFF(MICROSECOND, run_at, UTC_TIMESTAMP(6)) / 1e6 "
                       "FROM mysqlq_message WHERE id = %s", [message_id])
        return float(cursor.fetchone()[0])


def add_worker(worker_id: str, silent_days: float, stopped: bool) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO mysqlq_worker (id, host, pid, queues, concurrency, connection_id, "
            "started_at, last_heartbeat, stopped_at, listening, processed, failed) VALUES "
            "(%s, 'h', 1, 'default', 1, NULL, UTC_TIMESTAMP(6) - INTERVAL %s SECOND, "
            "UTC_TIMESTAMP(6) - INTERVAL %s SECOND, "
            "IF(%s, UTC_TIMESTAMP(6) - INTERVAL %s SECOND, NULL), 0, 0, 0)",
            [worker_id, int(silent_days * DAY) + 60, int(silent_days * DAY), stopped,
             int(silent_days * DAY)])


# --------------------------------------------------------------------------- a death's time


def test_a_message_dying_records_when_it_died_not_when_it_was_due():
    handle = tasks.always_fails.enqueue("late")
    with connection.cursor() as cursor:  # due ten days ago: it waited in a long backlog
        cursor.execute("UPDATE mysqlq_message SET run_at = run_at - INTERVAL 10 DAY "
                       "WHERE id = %s", [handle.id])
    message = claim_only(handle.id, "default")
    broker.fail(message, RUNNER, AttemptResult(started_at=broker.database_now(),
                                               error_class="ValueError", error_message="x"),
                retry=False)
    assert Message.objects.get(pk=handle.id).status == "dead"
    assert seconds_since_run_at(handle.id) < 60


def test_a_message_lost_on_its_last_attempt_records_when_it_died():
    handle = tasks.record.enqueue("lost")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_message SET run_at = run_at - INTERVAL 10 DAY, "
                       "max_attempts = 1 WHERE id = %s", [handle.id])
    claim_in_peer(handle.id)
    assert wait_for(lambda: broker.recover(), timeout=5, message="a recovery") == [handle.id]
    assert Message.objects.get(pk=handle.id).status == "dead"
    assert seconds_since_run_at(handle.id) < 60


# --------------------------------------------------------------------------- broker


def test_purge_dead_batch_deletes_only_old_dead_messages_and_keeps_their_arguments():
    old = [make_dead(label=f"old{i}") for i in range(3)]
    recent = make_dead(label="recent")
    for message_id in old:
        age_dead(message_id, 10)
    ready = tasks.record.enqueue("ready").id
    scheduled = tasks.record.using(delay=3600).enqueue("later").id
    with connection.cursor() as cursor:  # old, but not dead: never purged
        cursor.execute("UPDATE mysqlq_message SET run_at = run_at - INTERVAL 30 DAY "
                       "WHERE id IN (%s, %s)", [ready, scheduled])
    before = broker.database_now() - dt.timedelta(days=1)
    assert broker.count_dead_before(before) == 3
    assert broker.purge_dead_batch(before, 2, OPERATOR) == 2
    assert broker.purge_dead_batch(before, 2, OPERATOR) == 1
    assert broker.purge_dead_batch(before, 2, OPERATOR) == 0
    assert set(Message.objects.values_list("pk", flat=True)) == {recent, ready, scheduled}
    rows = list(Attempt.objects.filter(outcome="cancelled").order_by("message_id"))
    assert [row.message_id for row in rows] == old
    for index, row in enumerate(rows):
        assert (row.actor, row.error_message) == ("test:alice", "dead message purged")
        assert payload.decode(row.payload) == ([f"old{index}"], {})


def test_purge_dead_batch_needs_autocommit():
    from django.db import transaction

    with transaction.atomic(), pytest.raises(RuntimeError, match="autocommit"):
        broker.purge_dead_batch(broker.database_now(), 10, OPERATOR)


def test_purge_workers_batch_deletes_only_stopped_and_long_silent_rows():
    add_worker("old-stopped", 10, stopped=True)
    add_worker("old-stopped-2", 9, stopped=True)
    add_worker("recent-stopped", 1, stopped=True)
    add_worker("old-unmarked", 10, stopped=False)  # the leader marks it stopped first
    before = broker.database_now() - dt.timedelta(days=7)
    assert broker.count_workers_before(before) == 2
    assert broker.purge_workers_batch(before, 1) == 1
    assert broker.purge_workers_batch(before, 1) == 1
    assert broker.purge_workers_batch(before, 1) == 0
    assert sorted(Worker.objects.values_list("pk", flat=True)) == [
        "old-unmarked", "recent-stopped"]


# --------------------------------------------------------------------------- queuepurge


def test_queuepurge_deletes_old_dead_messages_and_worker_rows():
    old = [make_dead(label=f"old{i}") for i in range(5)]
    recent = make_dead(label="recent")
    for message_id in old:
        age_dead(message_id, 40)
    add_worker("gone", 40, stopped=True)
    add_worker("fresh", 0.5, stopped=True)

    out, _ = run("queuepurge", "--dead-older-than", "30d", "--workers-older-than", "2w",
                 "--dry-run")
    lines = out.splitlines()
    assert lines[0].startswith("5 dead message(s) that died before ")
    assert lines[1].startswith("1 stopped worker row(s) last heard from before ")
    assert Message.objects.count() == 6 and Worker.objects.count() == 2

    out, err = run("queuepurge", "--dead-older-than", "30d", "--workers-older-than", "2w",
                   "--batch-size", "2")
    assert out.splitlines() == [
        "Deleted 5 dead message(s); history keeps each as 'cancelled', with its arguments.",
        "Deleted 1 worker row(s)."]
    assert err.splitlines() == ["deleted dead 2/5", "deleted dead 4/5", "deleted dead 5/5",
                                "deleted workers 1/1"]
    assert list(Message.objects.values_list("pk", flat=True)) == [recent]
    assert list(Worker.objects.values_list("pk", flat=True)) == ["fresh"]
    purged = Attempt.objects.filter(outcome="cancelled")
    assert sorted(purged.values_list("message_id", flat=True)) == old
    assert {(a.actor.split(":")[0], a.error_message) for a in purged} == {
        ("cli", "dead message purged")}


def test_queuepurge_needs_something_to_purge():
    with pytest.raises(CommandError, match="at least one of --older-than"):
        run("queuepurge")
    with pytest.raises(CommandError, match="at most 100 years"):
        run("queuepurge", "--dead-older-than", "99999999999w")


# --------------------------------------------------------------------------- the leader


def test_retention_prune_follows_the_settings(settings, caplog):
    old, recent = make_dead(label="old"), make_dead(label="recent")
    age_dead(old, 3)
    add_worker("gone", 8, stopped=True)
    add_worker("fresh", 6, stopped=True)

    settings.MYSQLQ = {**settings.MYSQLQ, "WORKER_RETENTION_SECONDS": None}
    assert retention.prune("w", "h", 1) == (0, 0)  # dead kept forever by default

    settings.MYSQLQ = {**settings.MYSQLQ, "DEAD_RETENTION_SECONDS": 2 * DAY,
                       "WORKER_RETENTION_SECONDS": 7 * DAY}
    with caplog.at_level("INFO", logger="django_mysqlq"):
        assert retention.prune("host:9:abc", "host", 9) == (1, 1)
    assert list(Message.objects.values_list("pk", flat=True)) == [recent]
    assert list(Worker.objects.values_list("pk", flat=True)) == ["fresh"]
    [row] = Attempt.objects.filter(outcome="cancelled")
    assert (row.message_id, row.actor, row.error_message) == (
        old, "worker:host:9:abc", "dead message purged")
    assert "Retention: deleted 1 dead message(s)" in caplog.text
    assert "Retention: deleted 1 row(s) of workers" in caplog.text


def test_retention_prune_is_bounded_per_call(settings, monkeypatch):
    monkeypatch.setattr(retention, "BATCH", 2)
    monkeypatch.setattr(retention, "BATCHES_PER_CALL", 2)
    for index in range(5):
        age_dead(make_dead(label=f"d{index}"), 3)
    settings.MYSQLQ = {**settings.MYSQLQ, "DEAD_RETENTION_SECONDS": DAY}
    assert retention.prune("w", "h", 1) == (4, 0)
    assert retention.prune("w", "h", 1) == (1, 0)
    assert not Message.objects.exists()


@pytest.mark.worker
def test_the_recovery_leader_prunes_dead_messages_and_worker_rows(start_worker):
    old, recent = make_dead(label="old"), make_dead(label="recent")
    age_dead(old, 3)
    add_worker("gone", 8, stopped=True)  # WORKER_RETENTION_SECONDS' default: 7 days
    worker = start_worker("--burst", env={"MYSQLQ_TEST_DEAD_RETENTION": str(2 * DAY)})
    assert worker.wait(timeout=60) == 0, worker.output()
    assert list(Message.objects.values_list("pk", flat=True)) == [recent]
    assert not Worker.objects.filter(pk="gone").exists()
    [row] = Attempt.objects.filter(outcome="cancelled")
    assert row.message_id == old and row.actor.startswith("worker:")
    assert "Retention: deleted 1 dead message(s)" in worker.output()
