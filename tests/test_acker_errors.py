"""An unexpected error in one ack batch doesn't end the acker, against the real server.

Before, any error but a DatabaseError killed the acker thread silently: the batch stayed
"being written" forever, task threads blocked in ``add()`` and the worker kept renewing
the batch's claims, so no peer ever recovered them.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import threading
from typing import Any

import pytest
from django.utils import timezone

from django_mysqlq import broker
from django_mysqlq.broker.history import result_json
from django_mysqlq.messages import AttemptResult, Runner
from django_mysqlq.models import Attempt, Message
from django_mysqlq.worker import acker as acker_module
from django_mysqlq.worker.acker import Acker
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "test:acker-errors"
RUNNER = Runner(worker_id=WORKER, host="test", pid=1, thread="test")


def ok() -> AttemptResult:
    return AttemptResult(started_at=timezone.now(), result="ok")


def test_an_unexpected_error_gives_the_batch_to_recovery_and_the_acker_goes_on(
        monkeypatch, caplog):
    ids = [tasks.record.enqueue(f"m{i}").id for i in range(4)]
    claimed = {m.id: m for m in broker.claim(["default"], 4, WORKER, lease_seconds=60)}
    first, second = [claimed[i] for i in ids[:2]], [claimed[i] for i in ids[2:]]
    real = broker.ack_many
    calls: list[list[int]] = []

    def fails_once(batch: list[Any], busy: Any = None) -> set[int]:
        calls.append([m.id for m, _, _ in batch])
        if len(calls) == 1:
            raise RuntimeError("dictionary changed size during iteration")
        return real(batch, busy=busy)

    monkeypatch.setattr(acker_module.broker, "ack_many", fails_once)
    counts: collections.Counter[str] = collections.Counter()
    # A long delay: each batch is exactly two successes, sent when the second is added.
    acker = Acker(2, delay=60.0, give_up=threading.Event(),
                  report=lambda **c: counts.update(c))
    acker.start()
    added = threading.Event()

    def task_thread() -> None:
        for message in [*first, *second]:  # blocks in add() if the acker is gone
            acker.add(message, RUNNER, ok())
        added.set()

    thread = threading.Thread(target=task_thread, daemon=True)
    with caplog.at_level(logging.ERROR, logger="django_mysqlq"):
        thread.start()
        try:
            assert added.wait(30), "a task thread stayed blocked in Acker.add()"
            wait_for(lambda: counts["succeeded"] == 2, timeout=30,
                     message="the batch after the failed one to be acked")
        finally:
            acker.stop()
    assert calls == [ids[:2], ids[2:]]
    assert counts == {"unacked": 2, "succeeded": 2}
    assert "dictionary changed size" in caplog.text and "run again" in caplog.text
    # The second batch is done; the failed one is not lost: still claimed, no longer held
    # (its lease is not renewed), not released as unstarted, and recovered once it expires.
    assert not Message.objects.filter(pk__in=ids[2:]).exists()
    assert Attempt.objects.filter(message_id__in=ids[2:], outcome="succeeded").count() == 2
    assert set(Message.objects.filter(pk__in=ids[:2]).values_list("status", flat=True)) == {
        "claimed"}
    assert acker.held_pairs() == []
    assert first[0].claim_token in acker.unacked_tokens()
    Message.objects.filter(pk__in=ids[:2]).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert sorted(broker.recover()) == ids[:2]
    assert set(Message.objects.filter(pk__in=ids[:2]).values_list("status", flat=True)) == {
        "ready"}


class _ChangingDict(dict):
    """A result another thread mutates while it is encoded."""

    def items(self) -> Any:
        raise RuntimeError("dictionary changed size during iteration")


def test_a_result_that_fails_to_encode_in_any_way_is_dropped_not_raised(caplog):
    tasks.record.enqueue("r")
    [message] = broker.claim(["default"], 1, WORKER, lease_seconds=60)
    with caplog.at_level(logging.WARNING, logger="django_mysqlq"):
        assert result_json(message, _ChangingDict(a=1)) is None
    assert "not storable" in caplog.text


def test_an_ack_whose_commit_reply_was_lost_is_retried_without_a_second_history_row(
        monkeypatch, caplog):
    """The COMMIT lands on the server but its reply is lost (2013): the acker retries the
    batch, finds its rows gone, and must neither write their history again nor report
    work done as "recovered by a peer; it runs again"."""
    from django.db import OperationalError

    from django_mysqlq.broker import settle as settle_module
    from django_mysqlq.worker.attempt_log import AttemptLine

    ids = [tasks.record.enqueue(f"c{i}").id for i in range(2)]
    claimed = broker.claim(["default"], 2, WORKER, lease_seconds=60)
    real = settle_module.in_transaction
    lost: list[int] = []

    def reply_lost_once(alias: str, body: Any) -> Any:
        value = real(alias, body)  # committed
        if not lost:
            lost.append(1)
            raise OperationalError(2013, "Lost connection to server during query")
        return value

    monkeypatch.setattr(settle_module, "in_transaction", reply_lost_once)
    counts: collections.Counter[str] = collections.Counter()
    acker = Acker(2, delay=60.0, give_up=threading.Event(),
                  report=lambda **c: counts.update(c))
    acker.start()
    with caplog.at_level(logging.INFO):
        try:
            for message in claimed:
                acker.add(message, RUNNER, ok(), AttemptLine(message))
            wait_for(lambda: sum(counts.values()) == 2, timeout=60,
                     message="the batch to be settled")
        finally:
            acker.stop()
    assert lost == [1]
    assert not Message.objects.filter(pk__in=ids).exists()
    assert sorted(Attempt.objects.filter(message_id__in=ids)
                  .values_list("message_id", "outcome")) == [
        (ids[0], "succeeded"), (ids[1], "succeeded")]
    assert (counts["succeeded"], counts["unacked"]) == (2, 0)
    assert "recovered by a peer" not in caplog.text
    assert acker.unacked_tokens() == []
