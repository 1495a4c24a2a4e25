"""The gate table (ordered subjects and concurrency keys); :mod:`models` re-exports it."""

from __future__ import annotations

import hashlib

from django.db import models

from .managers import BoundManager


def gate_id(queue: str, ordered: bool, key: str) -> str:
    """The primary key of a gate: a digest of what identifies it (see :class:`Gate`)."""
    text = f"{queue}\x00{int(ordered)}\x00{key}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:GATE_ID_LENGTH]


#: Hex digits of a gate's id (128 bits of SHA-256).
GATE_ID_LENGTH = 32


class Gate(models.Model):
    """One live ordered subject or concurrency key of a queue.

    ``active`` counts the messages holding one of its ``slots`` (ready, claimed, an ordered
    head scheduled for its retry, a dead head that holds its subject) and ``blocked`` the
    ones waiting. Both are read and written only under this row's lock, which producers
    of the gate also take first: so messages of a subject get their ids in commit order.
    A row with nothing active or blocked is deleted by the statement that empties it.
    Signed counters: a value changed by hand can't make an ack fail on an out-of-range
    subtraction; the recovery leader repairs counters that disagree with the messages.

    The identity (queue, ordered, key) is the primary key, as a digest (:func:`gate_id`):
    a producer's ``INSERT … ON DUPLICATE KEY UPDATE`` then locks the one row. On a unique
    secondary key InnoDB takes a next-key lock (the gap before the row too), and producers
    creating gates beside one another deadlocked (measured: under REPEATABLE READ).
    """

    id = models.CharField(max_length=GATE_ID_LENGTH, primary_key=True)
    queue = models.CharField(max_length=64)
    #: An ordered subject (one at a time, in order) or a concurrency key (``slots`` at once).
    ordered = models.BooleanField()
    gate_key = models.CharField(max_length=255)
    slots = models.PositiveIntegerField()
    active = models.IntegerField(default=0)
    blocked = models.IntegerField(default=0)
    #: Last change under the row's lock: the repair checks gates unchanged for a lease.
    changed_at = models.DateTimeField()

    objects = BoundManager["Gate"]()

    class Meta:
        db_table = "mysqlq_gate"
        verbose_name = "subject or concurrency key"
        verbose_name_plural = "subjects and concurrency keys"
        indexes = [
            models.Index(fields=["changed_at"], name="mysqlq_gate_changed"),
            models.Index(fields=["gate_key"], name="mysqlq_gate_key"),
        ]

    def __str__(self) -> str:
        kind = "subject" if self.ordered else "concurrency key"
        return f"{self.queue}: {kind} {self.gate_key}"
