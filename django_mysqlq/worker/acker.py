"""Batched acks: task threads hand over successes, one thread acks them together.

A crash loses the acks not yet committed, so those tasks run again: at most
``MYSQLQ['ACK_BATCH_SIZE']`` of them, since task threads wait while that many successes
are unacked (being written or waiting to be).
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, connections

from .. import broker
from ..messages import AttemptResult, ClaimedMessage, Runner
from .executor import settle

logger = logging.getLogger("django_mysqlq")

Finished = tuple[ClaimedMessage, Runner, AttemptResult]


class Acker:
    """Collects successful attempts and acks them in batches on its own connection."""

    def __init__(self, batch_size: int, delay: float, give_up: threading.Event) -> None:
        self.batch_size = batch_size
        self.delay = delay
        self._give_up = give_up
        self._pending: list[Finished] = []
        #: The batch being written: its claims are still ours until it commits.
        self._writing: list[Finished] = []
        self._oldest = 0.0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mysqlq-acker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def pending(self) -> int:
        """Successes not acked yet (their claims must keep being renewed)."""
        return len(self._pending)

    def held_pairs(self) -> list[tuple[int, str]]:
        """(id, token) of successes not acked yet (being written or waiting)."""
        with self._cond:
            return [(m.id, m.claim_token) for m, _, _ in [*self._writing, *self._pending]]

    def add(self, message: ClaimedMessage, runner: Runner, result: AttemptResult) -> None:
        """Queue one success; blocks while a batch's worth is unacked, which bounds the loss."""
        with self._cond:
            while (len(self._pending) + len(self._writing) >= self.batch_size
                   and not self._stopping):
                self._cond.wait(0.1)
            if not self._pending:
                self._oldest = time.monotonic()
            self._pending.append((message, runner, result))
            self._cond.notify_all()

    def stop(self) -> None:
        """Ack what is pending and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _take(self) -> list[Finished] | None:
        with self._cond:
            while True:
                if self._pending and (
                    self._stopping
                    or len(self._pending) >= self.batch_size
                    or time.monotonic() - self._oldest >= self.delay
                ):
                    batch, self._pending = self._pending, []
                    self._writing = batch
                    self._cond.notify_all()
                    return batch
                if self._stopping:
                    return None
                timeout = self.delay - (time.monotonic() - self._oldest) if self._pending \
                    else None
                self._cond.wait(timeout)

    def _ack(self, batch: list[Finished]) -> None:
        """Ack a batch; if the server refuses it, ack one by one so one bad row stays alone."""
        try:
            settle(lambda: broker.ack_many(batch), f"a batch of {len(batch)} acks",
                   self._give_up)
            return
        except DatabaseError as exc:
            if len(batch) == 1:
                message = batch[0][0]
                logger.error("Could not ack %s #%s (%s); it stays claimed and will be "
                             "recovered and run again.", message.task_name, message.id, exc)
                return
            logger.warning("A batch of %d acks was refused (%s); acking them one by one.",
                           len(batch), exc)
        for finished in batch:
            self._ack([finished])

    def _run(self) -> None:
        broker.own_connection()  # acks run at READ COMMITTED whatever the site's level
        try:
            while (batch := self._take()) is not None:
                self._ack(batch)
                with self._cond:
                    self._writing = []
                    self._cond.notify_all()
        finally:
            connections.close_all()
