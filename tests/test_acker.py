"""The acker's bound: a crash re-runs at most ACK_BATCH_SIZE finished tasks.

Unit tests: the broker's ack is replaced by a recorder, so they need no database and
check only how the acker batches and when it makes task threads wait.
"""

from __future__ import annotations

import collections
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import DatabaseError

from django_mysqlq.worker import acker as acker_module
from django_mysqlq.worker.acker import Acker


class SlowAcks:
    """Stands in for broker.ack_many: records each batch and what was unacked meanwhile."""

    def __init__(self, acker_ref: list[Acker], seconds: float) -> None:
        self.acker_ref = acker_ref
        self.seconds = seconds
        self.batches: list[list[Any]] = []
        self.most_unacked = 0

    def __call__(self, batch: list[Any]) -> set[int]:
        time.sleep(self.seconds)  # while this "commits", task threads keep finishing
        unacked = len(batch) + self.acker_ref[0].pending
        self.most_unacked = max(self.most_unacked, unacked)
        self.batches.append(list(batch))
        return {message for message, _, _ in batch}


@pytest.mark.parametrize("batch_size", [1, 5, 20])
def test_unacked_successes_never_exceed_the_batch_size(monkeypatch, batch_size):
    holder: list[Acker] = []
    acks = SlowAcks(holder, seconds=0.01)
    monkeypatch.setattr(acker_module.broker, "ack_many", acks)
    acker = Acker(batch_size, delay=0.005, give_up=threading.Event())
    holder.append(acker)
    acker.start()

    def task_thread(start: int) -> None:
        for number in range(start, start + 50):
            acker.add(number, None, None)  # type: ignore[arg-type]

    threads = [threading.Thread(target=task_thread, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    acker.stop()

    acked = [message for batch in acks.batches for message, _, _ in batch]
    assert sorted(acked) == sorted(n * 1000 + i for n in range(4) for i in range(50))
    assert acks.most_unacked <= batch_size
    assert max(len(batch) for batch in acks.batches) <= batch_size
    if batch_size > 1:
        assert max(len(batch) for batch in acks.batches) > 1  # it did batch


def test_a_refused_batch_is_acked_one_by_one(monkeypatch):
    seen: list[int] = []

    def refuse_batches(batch: list[Any]) -> set[int]:
        if len(batch) > 1:
            raise DatabaseError("a row of this batch was refused")
        seen.append(batch[0][0])
        return {batch[0][0]}

    monkeypatch.setattr(acker_module.broker, "ack_many", refuse_batches)
    acker = Acker(10, delay=0.05, give_up=threading.Event())
    acker.start()
    for number in range(6):
        acker.add(number, None, None)  # type: ignore[arg-type]
    acker.stop()
    assert sorted(seen) == list(range(6))


def test_successes_are_reported_once_their_ack_is_written(monkeypatch):
    written: list[int] = []

    def ack_all_but_the_lost(batch: list[Any]) -> set[int]:
        written.extend(m.id for m, _, _ in batch)
        return {m.id for m, _, _ in batch if m.id != 3}  # 3's claim was recovered by a peer

    monkeypatch.setattr(acker_module.broker, "ack_many", ack_all_but_the_lost)
    counts: collections.Counter[str] = collections.Counter()
    acker = Acker(10, delay=0.01, give_up=threading.Event(),
                  report=lambda **c: counts.update(c))
    acker.start()
    for number in range(6):
        acker.add(SimpleNamespace(id=number, claim_token="t"), None, None)  # type: ignore[arg-type]
    acker.stop()
    assert sorted(written) == list(range(6))
    assert (counts["succeeded"], counts["unacked"]) == (5, 1)


def test_stop_leaves_an_ack_stuck_past_the_stop_deadline_behind_as_unacked(monkeypatch):
    """The stop's bound: a hung ack statement can't hold the worker past its deadline."""
    release = threading.Event()

    def hangs(batch: list[Any]) -> set[int]:
        release.wait(10)
        return {m.id for m, _, _ in batch}

    monkeypatch.setattr(acker_module.broker, "ack_many", hangs)
    counts: collections.Counter[str] = collections.Counter()
    acker = Acker(10, delay=0.01, give_up=threading.Event(),
                  report=lambda **c: counts.update(c))
    acker.start()
    for number in range(3):
        acker.add(SimpleNamespace(id=number, claim_token=f"t{number}"),  # type: ignore[arg-type]
                  None, None)  # type: ignore[arg-type]
    acker.finish_by(time.monotonic() + 0.3)
    started = time.monotonic()
    try:
        acker.stop()
        waited = time.monotonic() - started
    finally:
        release.set()
    assert waited < 0.3 + acker_module.JOIN_MARGIN + 1.0  # a liveness bound, with slack
    assert counts == {"unacked": 3}
    assert acker.unacked_tokens() == ["t0", "t1", "t2"]
