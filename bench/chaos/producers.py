"""Producer threads: small transactions of plain and atomic messages at a steady rate.

Each transaction writes its messages and one :class:`Enqueued` row per message, so the
table of what was enqueued is exact even when a commit's answer is lost in an outage.
A few transactions roll back on purpose: their messages must never run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
import uuid

from django.db import DatabaseError, connections, transaction

from .config import ChaosConfig
from .ledger import tasks
from .ledger.models import Enqueued, Kind


class _Rollback(Exception):
    """Raised inside a transaction to roll it back on purpose."""


@dataclasses.dataclass
class ProducerStats:
    transactions: int = 0
    committed: int = 0
    rolled_back: int = 0
    errors: int = 0
    #: Tokens of messages in transactions rolled back on purpose (must never run).
    rolled_back_tokens: list[str] = dataclasses.field(default_factory=list)
    last_error: str = ""


class Producer(threading.Thread):
    def __init__(self, index: int, config: ChaosConfig, stop: threading.Event,
                 seed: int) -> None:
        super().__init__(name=f"chaos-producer-{index}", daemon=True)
        self.index = index
        self.config = config
        self.stop = stop
        self.rng = random.Random(seed)
        self.stats = ProducerStats()

    def run(self) -> None:
        config = self.config
        # Mean pause between transactions that gives this producer its share of the rate.
        mean_batch = (1 + config.max_batch) / 2
        pause = mean_batch * config.producers / config.rate
        try:
            while not self.stop.is_set():
                self._one()
                self.stop.wait(self.rng.expovariate(1 / pause))
        finally:
            connections.close_all()

    def _one(self) -> None:
        rng, stats = self.rng, self.stats
        stats.transactions += 1
        tokens: list[str] = []
        try:
            with transaction.atomic():
                for _ in range(rng.randint(1, self.config.max_batch)):
                    tokens.append(self._enqueue(rng))
                if rng.random() < self.config.rollback_share:
                    raise _Rollback
            stats.committed += 1
        except _Rollback:
            stats.rolled_back += 1
            stats.rolled_back_tokens.extend(tokens)
        except DatabaseError as exc:  # an outage or a killed connection: try again later
            stats.errors += 1
            stats.last_error = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(DatabaseError):
                connections["default"].close()
            self.stop.wait(0.2)

    def _enqueue(self, rng: random.Random) -> str:
        config = self.config
        token = uuid.uuid4().hex
        draw = rng.random()
        kind = Kind.ATOMIC if draw < config.atomic_share else \
            Kind.ORDERED if draw < config.atomic_share + config.ordered_share else \
            Kind.LIMITED if draw < config.atomic_share + config.ordered_share \
            + config.limited_share else Kind.PLAIN
        delay = rng.uniform(0.05, config.max_delay) if rng.random() < config.delayed_share \
            else 0.0
        sleep_ms = rng.randint(0, config.max_sleep_ms)
        gate_key = ""
        if kind in (Kind.ORDERED, Kind.LIMITED):
            gate_key = f"{kind[0]}{rng.randrange(config.gate_keys)}"
            task = tasks.ordered if kind == Kind.ORDERED else tasks.limited
            handle = (task.using(delay=delay) if delay else task).enqueue(token, gate_key,
                                                                          sleep_ms)
        else:
            task = tasks.atomic if kind == Kind.ATOMIC else tasks.plain
            if delay:
                task = task.using(delay=delay)
            handle = task.enqueue(token, sleep_ms)
        Enqueued.objects.create(token=token, message_id=handle.id, kind=kind, delay=delay,
                                sleep_ms=sleep_ms, producer=self.index, at=time.time(),
                                gate_key=gate_key)
        return token


def enqueue_crash() -> int:
    """One message of the crashing task, enqueued like the producers' (with its ledger row
    in the same transaction); its id."""
    token = uuid.uuid4().hex
    try:
        with transaction.atomic():
            handle = tasks.crash.enqueue(token)
            Enqueued.objects.create(token=token, message_id=handle.id, kind=Kind.CRASH,
                                    delay=0.0, sleep_ms=0, producer=0, at=time.time())
    finally:
        connections.close_all()
    return handle.id
