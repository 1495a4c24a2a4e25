"""Three tables the chaos run judges the queue by.

* :class:`Enqueued`: one row per message, written by the producer in the transaction
  that enqueues it, so it exists exactly when the message does (with its subject or
  concurrency key, for the order and limit audit).
* :class:`Execution`: one row when a task body starts and one when it ends, written on a
  connection of their own (alias ``ledger``) so a rolled-back atomic task keeps them.
* :class:`Effect`: the business write of an atomic task, in the task's transaction.
  Deliberately not unique per message: a second commit would show as a second row.

Times are epoch seconds of the host clock (workers, harness and server share a host).
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models


class Kind(models.TextChoices):
    PLAIN = "plain", "Plain"
    ATOMIC = "atomic", "Atomic"
    #: Kills its worker process at once (the chaos "crashing task" fault).
    CRASH = "crash", "Crash"
    #: Runs in its ordered subject: one at a time, in enqueue order.
    ORDERED = "ordered", "Ordered"
    #: Runs under its concurrency key's limit.
    LIMITED = "limited", "Limited"
    #: Runs under its rate key's limit (so many starts per window).
    RATED = "rated", "Rated"


class Enqueued(models.Model):
    token = models.CharField(max_length=32, unique=True)
    message_id = models.BigIntegerField(db_index=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    delay = models.FloatField()
    sleep_ms = models.PositiveIntegerField()
    producer = models.PositiveSmallIntegerField()
    at = models.FloatField()
    #: The ordered subject, concurrency key or rate key of an ordered, limited or rated
    #: message.
    gate_key = models.CharField(max_length=64, blank=True, default="")

    objects: ClassVar[models.Manager[Enqueued]] = models.Manager()

    class Meta:
        db_table = "chaos_enqueued"

    def __str__(self) -> str:
        return f"{self.kind} #{self.message_id}"


class Edge(models.TextChoices):
    START = "start", "Start"
    END = "end", "End"


class Execution(models.Model):
    #: One id per run of a task body; a message run twice has two.
    run = models.CharField(max_length=32)
    edge = models.CharField(max_length=5, choices=Edge.choices)
    token = models.CharField(max_length=32, db_index=True)
    message_id = models.BigIntegerField(db_index=True)
    attempt = models.PositiveIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    pid = models.PositiveIntegerField()
    thread = models.CharField(max_length=100)
    at = models.FloatField()

    objects: ClassVar[models.Manager[Execution]] = models.Manager()

    class Meta:
        db_table = "chaos_execution"
        constraints = [
            # Lets a write retried after a lost connection be idempotent.
            models.UniqueConstraint(fields=["run", "edge"], name="chaos_execution_once"),
        ]

    def __str__(self) -> str:
        return f"#{self.message_id} {self.edge} ({self.run})"


class Effect(models.Model):
    token = models.CharField(max_length=32)
    message_id = models.BigIntegerField(db_index=True)
    pid = models.PositiveIntegerField()
    at = models.FloatField()

    objects: ClassVar[models.Manager[Effect]] = models.Manager()

    class Meta:
        db_table = "chaos_effect"

    def __str__(self) -> str:
        return f"effect of #{self.message_id}"


class Published(models.Model):
    """One row per topic message, written by the producer in the transaction that
    publishes it: it exists exactly when the message does."""

    token = models.CharField(max_length=32, unique=True)
    #: The message's key ("" for none).
    key = models.CharField(max_length=16, blank=True, default="")
    #: Published by ``publish_many`` (else ``publish``).
    bulk = models.BooleanField(default=False)
    producer = models.PositiveSmallIntegerField()
    at = models.FloatField()

    objects: ClassVar[models.Manager[Published]] = models.Manager()

    class Meta:
        db_table = "chaos_published"

    def __str__(self) -> str:
        return f"published {self.token}"


class Handled(models.Model):
    """A consumer group's handler at work: a ``start`` row, then an ``end`` row with its
    outcome (``ok``, or ``failed`` for a failure drawn on purpose), on the ``ledger``
    connection."""

    run = models.CharField(max_length=32)
    edge = models.CharField(max_length=5, choices=Edge.choices)
    outcome = models.CharField(max_length=8, blank=True, default="")
    token = models.CharField(max_length=32, db_index=True)
    group = models.CharField(max_length=16)
    offset = models.BigIntegerField()
    #: The delivery (a queue message) and its attempt, from the ``task_started`` signal.
    message_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()
    at = models.FloatField()

    objects: ClassVar[models.Manager[Handled]] = models.Manager()

    class Meta:
        db_table = "chaos_handled"
        constraints = [
            models.UniqueConstraint(fields=["run", "edge"], name="chaos_handled_once"),
        ]

    def __str__(self) -> str:
        return f"{self.group} {self.edge} {self.token}"


class Heard(models.Model):
    """A broadcast handler's run: one row per process and message (a second is a
    duplicate)."""

    run = models.CharField(max_length=32, unique=True)
    token = models.CharField(max_length=32, db_index=True)
    offset = models.BigIntegerField()
    pid = models.PositiveIntegerField()
    at = models.FloatField()

    objects: ClassVar[models.Manager[Heard]] = models.Manager()

    class Meta:
        db_table = "chaos_heard"

    def __str__(self) -> str:
        return f"{self.pid} heard {self.token}"
