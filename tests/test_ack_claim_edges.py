"""Ack and claim edge cases (issue 10, item 11), against the real server.

An ack matches each message with its own claim token, never any id with any token; and
an error while claiming a later queue gives back what the earlier queues yielded.
"""

from __future__ import annotations

import importlib
import json
import logging

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from django_mysqlq import broker
from django_mysqlq.broker import settle
from django_mysqlq.messages import AttemptResult, Runner
from django_mysqlq.models import Attempt, Message
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "test:edges"
RUNNER = Runner(worker_id=WORKER, host="test", pid=1, thread="test")
TOKEN_INDEX = "mysqlq_msg_token"


def claim(queues=("default",), limit=10):
    return broker.claim(list(queues), limit, WORKER, lease_seconds=60)


def ok():
    return AttemptResult(started_at=timezone.now(), result="ok")


def test_a_stale_token_never_acks_the_message_reclaimed_under_another_token():
    """Same worker, same batch: ``id IN (…) AND token IN (…)`` deleted the re-claim."""
    first = tasks.record.enqueue("first").id
    second = tasks.record.enqueue("second").id
    [stale] = claim(limit=1)
    assert stale.id == first
    broker.release([stale])  # as a recovery would, while the first run still goes on
    again = {m.id: m for m in claim(limit=2)}
    assert set(again) == {first, second}
    assert again[first].claim_token != stale.claim_token

    owned = broker.ack_many([(stale, RUNNER, ok()), (again[second], RUNNER, ok())])

    assert owned == {second}
    kept = Message.objects.get(pk=first)
    assert (kept.status, kept.claim_token) == ("claimed", again[first].claim_token)
    assert not Message.objects.filter(pk=second).exists()
    # The late run is still recorded; the current claim runs to its own end.
    assert Attempt.objects.for_message(first).count() == 1


def claim_backlog(size: int, per_claim: int) -> list:
    """``size`` messages claimed ``per_claim`` to a token, as workers leave them, with fresh
    statistics."""
    tasks.record.enqueue_many([[f"m{i}"] for i in range(size)])
    batches = [claim(limit=per_claim) for _ in range(size // per_claim)]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE mysqlq_message")
        cursor.fetchall()
    return [m for batch in batches for m in batch]


@pytest.fixture
def claimed_backlog():
    return claim_backlog(3000, 10)


@pytest.mark.parametrize(("count", "backlog", "per_claim"), [
    (1, 3000, 10), (2, 3000, 10), (20, 3000, 10), (100, 3000, 10),
    (settle.ACK_DELETE_CHUNK, 20_000, 100),
])
def test_the_ack_delete_looks_up_exact_pairs_by_key_never_scans(count, backlog, per_claim):
    """One primary-key lookup per (id, token) pair, whatever the share of the table: a
    scan would wait on any row a stranger has locked (a DELETE gets no semi-consistent
    read), and a row constructor ``(id, claim_token) IN ((…))`` scanned for one pair."""
    claimed = claim_backlog(backlog, per_claim)
    chosen = claimed[500:500 + count]
    pairs, params = settle.pairs_table([(m.id, m.claim_token) for m in chosen])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN FORMAT=JSON " + settle.DELETE_PAIRS_SQL.format(pairs=pairs),
                       params)
        plan = json.loads(cursor.fetchone()[0])
    [message] = [step["table"] for step in plan["query_block"]["nested_loop"]
                 if step["table"]["table_name"] == "m"]
    assert message["key"] == "PRIMARY", message
    assert message["access_type"] in ("eq_ref", "const"), message  # const: one pair


def test_a_batch_larger_than_one_delete_is_acked_in_several(claimed_backlog):
    batch = claimed_backlog[:settle.ACK_DELETE_CHUNK + 7]
    owned = broker.ack_many([(m, RUNNER, ok()) for m in batch])
    assert owned == {m.id for m in batch}
    assert Message.objects.count() == len(claimed_backlog) - len(batch)


def test_an_error_claiming_a_later_queue_gives_back_the_batch_already_claimed(monkeypatch):
    """The second queue's claim fails: the first queue's batch is released.

    Without this it stayed claimed by a worker that never received it, until its lease
    ran out, and its recovery cost an attempt. (A locked row no longer fails a claim, it
    is stepped around: tests/test_locked_and_bad_rows.py; here the second queue's claim
    statement is made to fail as a lost connection would.)
    """
    first = tasks.record.enqueue("first").id
    blocked = tasks.on_other_queue.enqueue("blocked").id
    claim_module = importlib.import_module("django_mysqlq.broker.claim")
    real = claim_module.run_around_locks

    def fails_on_other(alias, key, what, fast, around, held=None):
        if key[1] == "other":
            raise OperationalError(2013, "Lost connection to server during query")
        return real(alias, key, what, fast, around, held)

    monkeypatch.setattr(claim_module, "run_around_locks", fails_on_other)
    with pytest.raises(OperationalError) as raised:
        claim(("default", "other"))
    assert raised.value.args[0] == 2013
    monkeypatch.setattr(claim_module, "run_around_locks", real)
    row = Message.objects.get(pk=first)
    assert (row.status, row.attempts, row.claim_token, row.worker_id) == \
        ("ready", 0, None, None)
    # Nothing was lost: both are claimed by the next loop.
    assert {m.id for m in claim(("default", "other"))} == {first, blocked}


def test_a_failed_bury_gives_back_its_own_batch_too(monkeypatch, caplog):
    """A row of the batch that can't be run goes dead (``bury``); a bury that failed (a
    lock wait on its gate, a lost connection) left the rest of that batch claimed by a
    worker that never received it, until its lease ran out."""
    good = [tasks.record.enqueue(f"g{n}").id for n in range(3)]
    bad = tasks.record.enqueue("bad").id
    with connection.cursor() as cursor:  # MariaDB's default sql_mode allows zero dates
        cursor.execute("UPDATE mysqlq_message SET enqueued_at = '0000-00-00 00:00:00' "
                       "WHERE id = %s", [bad])
    claim_module = importlib.import_module("django_mysqlq.broker.claim")

    def fails(*args, **kwargs):
        raise OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction")

    monkeypatch.setattr(claim_module, "bury", fails)
    with pytest.raises(OperationalError), caplog.at_level(logging.WARNING, "django_mysqlq"):
        claim(("default",))
    monkeypatch.undo()
    # (The count is what the release found: this queue's batch, not only earlier ones'.)
    assert "A claim failed part-way; 4 message(s) already claimed from this claim were " \
        "given back." in caplog.text
    rows = {m.pk: (m.status, m.claim_token) for m in Message.objects.filter(pk__in=good)}
    assert rows == {pk: ("ready", None) for pk in good}, rows


def test_a_claim_cut_short_before_it_claimed_anything_says_nothing(monkeypatch, caplog):
    """A producer's late wake-up (``KILL QUERY``) that ends the first statement: nothing
    was claimed, nothing given back. It used to warn 'A claim failed part-way; 0
    message(s) already claimed … were given back' (seen when the wake-ups of a busy queue
    kept cutting the claim's wait on a producer's uncommitted row short)."""
    tasks.record.enqueue("first")
    claim_module = importlib.import_module("django_mysqlq.broker.claim")

    def interrupted(alias, key, what, fast, around, held=None):
        raise OperationalError(1317, "Query execution was interrupted")

    monkeypatch.setattr(claim_module, "run_around_locks", interrupted)
    with pytest.raises(OperationalError), caplog.at_level(logging.INFO, "django_mysqlq"):
        claim(("default", "other"))
    monkeypatch.undo()
    assert "part-way" not in caplog.text
    assert Message.objects.get().status == "ready"



def _read_back_fails(monkeypatch, at: int = 1) -> None:
    """The ``at``-th read-back of a claim's rows fails, as a lost connection would (after
    the claim statement committed)."""
    claim_module = importlib.import_module("django_mysqlq.broker.claim")
    real, reads = claim_module.with_lock_retry, []

    def failing(alias, operation, *args, **kwargs):
        if getattr(operation, "__name__", "") == "read":
            reads.append(alias)
            if len(reads) == at:
                raise OperationalError(2013, "Lost connection to server during query")
        return real(alias, operation, *args, **kwargs)

    monkeypatch.setattr(claim_module, "with_lock_retry", failing)


def _given_back(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "given back" in r.getMessage()]


def test_a_read_back_cut_short_says_how_many_it_gave_back(monkeypatch, caplog):
    """The read-back of the rows a claim took fails: they are given back, and the warning
    counts them. That path released them without a word (and when earlier queues had
    yielded batches, the warning counted only those)."""
    first = [tasks.on_other_queue.enqueue(f"o{n}").id for n in range(2)]
    batch = [tasks.record.enqueue(f"d{n}").id for n in range(3)]
    _read_back_fails(monkeypatch, at=2)
    with pytest.raises(OperationalError), caplog.at_level(logging.WARNING, "django_mysqlq"):
        claim(("other", "default"))
    monkeypatch.undo()
    assert _given_back(caplog) == ["A claim failed part-way; 5 message(s) already claimed "
                                   "from this claim were given back."]
    rows = {m.pk: (m.status, m.attempts, m.claim_token)
            for m in Message.objects.filter(pk__in=first + batch)}
    assert rows == {pk: ("ready", 0, None) for pk in first + batch}, rows
    caplog.clear()
    _read_back_fails(monkeypatch, at=1)  # the only queue's: said too
    with pytest.raises(OperationalError), caplog.at_level(logging.WARNING, "django_mysqlq"):
        claim(("default",))
    monkeypatch.undo()
    assert _given_back(caplog) == ["A claim failed part-way; 3 message(s) already claimed "
                                   "from this claim were given back."]
    assert {m.id for m in claim(("other", "default"))} == set(first + batch)


def test_a_throttled_read_back_cut_short_says_how_many_it_gave_back(monkeypatch, caplog):
    from tests.testapp.rated_tasks import per_account

    ids = [per_account.enqueue(account, 0, "read-back").id for account in ("a", "b")]
    _read_back_fails(monkeypatch)
    with pytest.raises(OperationalError), caplog.at_level(logging.WARNING, "django_mysqlq"):
        broker.claim_throttled(["default"], 10, WORKER, 60)
    monkeypatch.undo()
    assert _given_back(caplog) == ["A claim failed part-way; 2 message(s) already claimed "
                                   "from the rate-limited keys were given back."]
    rows = {m.pk: (m.status, m.attempts, m.claim_token)
            for m in Message.objects.filter(pk__in=ids)}
    assert rows == {pk: ("throttled", 0, None) for pk in ids}, rows


def test_a_claim_that_claimed_nothing_gives_nothing_back(monkeypatch, caplog):
    """The first statement fails (the server went away): nothing was claimed, so nothing
    is released and nothing said. It used to try a release all the same and, that failing
    too, warn that '0 message(s) already claimed could not be given back'."""
    tasks.record.enqueue("first")
    claim_module = importlib.import_module("django_mysqlq.broker.claim")
    releases = []

    def lost(*args, **kwargs):
        raise OperationalError(2013, "Lost connection to server during query")

    def release(alias, token):
        releases.append(token)
        lost()

    monkeypatch.setattr(claim_module, "run_around_locks", lost)
    monkeypatch.setattr(claim_module, "_release_token", release)
    with pytest.raises(OperationalError), caplog.at_level(logging.INFO, "django_mysqlq"):
        claim(("default", "other"))
    monkeypatch.undo()
    assert releases == []
    assert "given back" not in caplog.text
