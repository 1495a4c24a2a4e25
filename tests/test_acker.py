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


def fake(number: int, token: str = "t", gate_key: str | None = None) -> Any:
    """A finished message as the acker sees it: its id, claim token and gate key."""
    return SimpleNamespace(id=number, claim_token=token, gate_key=gate_key)


class SlowAcks:
    """Stands in for broker.ack_many: records each batch and what was unacked meanwhile."""

    def __init__(self, acker_ref: list[Acker], seconds: float) -> None:
        self.acker_ref = acker_ref
        self.seconds = seconds
        self.batches: list[list[Any]] = []
        self.most_unacked = 0

    def __call__(self, batch: list[Any], busy: Any = None) -> set[int]:
        time.sleep(self.seconds)  # while this "commits", task threads keep finishing
        unacked = len(batch) + self.acker_ref[0].pending
        self.most_unacked = max(self.most_unacked, unacked)
        self.batches.append(list(batch))
        return {message.id for message, _, _ in batch}


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
            acker.add(fake(number), None, None)  # type: ignore[arg-type]

    threads = [threading.Thread(target=task_thread, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    acker.stop()

    acked = [message.id for batch in acks.batches for message, _, _ in batch]
    assert sorted(acked) == sorted(n * 1000 + i for n in range(4) for i in range(50))
    assert acks.most_unacked <= batch_size
    assert max(len(batch) for batch in acks.batches) <= batch_size
    if batch_size > 1:
        assert max(len(batch) for batch in acks.batches) > 1  # it did batch


def test_a_refused_batch_is_acked_one_by_one(monkeypatch):
    seen: list[int] = []

    def refuse_batches(batch: list[Any], busy: Any = None) -> set[int]:
        if len(batch) > 1:
            raise DatabaseError("a row of this batch was refused")
        seen.append(batch[0][0].id)
        return {batch[0][0].id}

    monkeypatch.setattr(acker_module.broker, "ack_many", refuse_batches)
    acker = Acker(10, delay=0.05, give_up=threading.Event())
    acker.start()
    for number in range(6):
        acker.add(fake(number), None, None)  # type: ignore[arg-type]
    acker.stop()
    assert sorted(seen) == list(range(6))


def test_successes_are_reported_once_their_ack_is_written(monkeypatch):
    written: list[int] = []

    def ack_all_but_the_lost(batch: list[Any], busy: Any = None) -> set[int]:
        written.extend(m.id for m, _, _ in batch)
        return {m.id for m, _, _ in batch if m.id != 3}  # 3's claim was recovered by a peer

    monkeypatch.setattr(acker_module.broker, "ack_many", ack_all_but_the_lost)
    counts: collections.Counter[str] = collections.Counter()
    acker = Acker(10, delay=0.01, give_up=threading.Event(),
                  report=lambda **c: counts.update(c))
    acker.start()
    for number in range(6):
        acker.add(fake(number), None, None)  # type: ignore[arg-type]
    acker.stop()
    assert sorted(written) == list(range(6))
    assert (counts["succeeded"], counts["unacked"]) == (5, 1)


def test_stop_leaves_an_ack_stuck_past_the_stop_deadline_behind_as_unacked(monkeypatch):
    """The stop's bound: a hung ack statement can't hold the worker past its deadline."""
    release = threading.Event()

    def hangs(batch: list[Any], busy: Any = None) -> set[int]:
        release.wait(10)
        return {m.id for m, _, _ in batch}

    monkeypatch.setattr(acker_module.broker, "ack_many", hangs)
    counts: collections.Counter[str] = collections.Counter()
    acker = Acker(10, delay=0.01, give_up=threading.Event(),
                  report=lambda **c: counts.update(c))
    acker.start()
    for number in range(3):
        acker.add(fake(number, f"t{number}"), None, None)  # type: ignore[arg-type]
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


def test_a_gated_success_is_acked_at_once_and_nudges_the_worker(monkeypatch):
    """No batching delay when an ack moves a subject: its next message waits for it."""
    acked_at: list[float] = []

    def ack(batch: list[Any], busy: Any = None) -> set[int]:
        acked_at.append(time.monotonic())
        return {m.id for m, _, _ in batch}

    monkeypatch.setattr(acker_module.broker, "ack_many", ack)
    nudged = threading.Event()
    acker = Acker(10, delay=5.0, give_up=threading.Event(), nudge=nudged.set)
    acker.start()
    added = time.monotonic()
    acker.add(fake(1, gate_key="order:1"), None, None)  # type: ignore[arg-type]
    assert nudged.wait(2.0)
    assert acked_at[0] - added < 1.0  # not the 5 s delay
    acker.stop()


def test_a_success_whose_gate_is_busy_is_tried_again_not_lost(monkeypatch):
    """A producer's transaction holds the gate: the ack leaves it out, the acker tries again
    shortly, and it is neither reported unacked nor released as unstarted meanwhile."""
    calls: list[list[int]] = []

    def ack(batch: list[Any], busy: Any = None) -> set[int]:
        calls.append([m.id for m, _, _ in batch])
        if len(calls) == 1 and busy is not None:
            busy.extend(f for f in batch if f[0].id == 2)
            return {m.id for m, _, _ in batch if m.id != 2}
        return {m.id for m, _, _ in batch}

    monkeypatch.setattr(acker_module.broker, "ack_many", ack)
    counts: collections.Counter[str] = collections.Counter()
    acker = Acker(10, delay=0.01, give_up=threading.Event(),
                  report=lambda **c: counts.update(c))
    acker.start()
    acker.add(fake(1, "t1", "a"), None, None)  # type: ignore[arg-type]
    acker.add(fake(2, "t2", "b"), None, None)  # type: ignore[arg-type]
    time.sleep(0.05)
    assert (2, "t2") in acker.held_pairs()  # still ours: its lease keeps being renewed
    deadline = time.monotonic() + 5
    while counts["succeeded"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    acker.stop()
    assert calls[-1] == [2] and len(calls) >= 2
    assert (counts["succeeded"], counts["unacked"]) == (2, 0)
    assert acker.unacked_tokens() == []
