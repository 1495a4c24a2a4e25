"""Producer threads: small transactions of tasks and topic messages at a steady rate.

Each transaction writes its messages and one :class:`Enqueued` row per message, so the
table of what was enqueued is exact even when a commit's answer is lost in an outage.
Topic messages (``publish`` and ``publish_many``, in the same transactions) get a
:class:`Published` row each the same way. A few transactions roll back on purpose: their
messages must never run, nor be handled.
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
from .ledger import stream, tasks
from .ledger.models import Enqueued, Kind, Published


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
    #: Topic messages in committed transactions, and in ones rolled back on purpose.
    published: int = 0
    published_rolled_back: int = 0
    #: Of the committed ones, those published by publish_many.
    published_bulk: int = 0
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
        #: Messages published with publish_many in the current transaction.
        self._bulk = 0

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
        published: list[str] = []
        self._bulk = 0
        try:
            with transaction.atomic():
                for _ in range(rng.randint(1, self.config.max_batch)):
                    if rng.random() < self.config.topic_share:
                        published += self._publish(rng)
                    else:
                        tokens.append(self._enqueue(rng))
                if rng.random() < self.config.rollback_share:
                    raise _Rollback
            stats.committed += 1
            stats.published += len(published)
            stats.published_bulk += self._bulk
        except _Rollback:
            stats.rolled_back += 1
            stats.rolled_back_tokens.extend(tokens + published)
            stats.published_rolled_back += len(published)
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
        kind = Kind.PLAIN
        for candidate, share in ((Kind.ATOMIC, config.atomic_share),
                                 (Kind.ORDERED, config.ordered_share),
                                 (Kind.LIMITED, config.limited_share),
                                 (Kind.RATED, config.rated_share)):
            if draw < share:
                kind = candidate
                break
            draw -= share
        delay = rng.uniform(0.05, config.max_delay) if rng.random() < config.delayed_share \
            else 0.0
        sleep_ms = rng.randint(0, config.max_sleep_ms)
        gate_key = ""
        if kind in (Kind.ORDERED, Kind.LIMITED, Kind.RATED):
            keys = config.rate_keys if kind == Kind.RATED else config.gate_keys
            gate_key = f"{kind[0]}{rng.randrange(keys)}"
            gated = tasks.ordered if kind == Kind.ORDERED else \
                tasks.limited if kind == Kind.LIMITED else tasks.rated
            handle = (gated.using(delay=delay) if delay else gated).enqueue(token, gate_key,
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


    def _publish(self, rng: random.Random) -> list[str]:
        """One message (``publish``) or a few (``publish_many``) to the topic."""
        config = self.config
        count = rng.randint(2, config.max_bulk) if rng.random() < config.bulk_share else 1
        tokens = [uuid.uuid4().hex for _ in range(count)]
        keys = [f"k{rng.randrange(config.topic_keys)}" if rng.random() < config.keyed_share
                else None for _ in tokens]
        values = [{"token": token, "sleep_ms": rng.randint(0, config.topic_max_sleep_ms)}
                  for token in tokens]
        if count == 1:
            stream.TOPIC.publish(values[0], key=keys[0])
        else:
            stream.TOPIC.publish_many(values, keys=keys)
            self._bulk += count
        now = time.time()
        Published.objects.bulk_create([
            Published(token=token, key=key or "", bulk=count > 1, producer=self.index, at=now)
            for token, key in zip(tokens, keys, strict=True)])
        return tokens


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
