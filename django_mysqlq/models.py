"""The queue's schema: the single source of truth for its tables.

* :class:`Message` is the hot table. It holds only unfinished messages; a
  finished one is deleted in the same transaction that writes its history row,
  so the claim index stays small whatever the volume processed.
* :class:`Attempt` is the history: one row per attempt (and per operator
  action), the trace the admin shows and the input of analytics.
* :class:`Worker` is one row per live worker process, renewed by heartbeats.
* :class:`QueueState` holds what an operator set on a queue (paused or not).
* :class:`Lease` names the one recovery sweeper on a cluster (``GET_LOCK`` is per node).
* :class:`Gate` is one row per live ordered subject or concurrency key: how many of its
  messages may hold a slot, how many do, and how many wait (``blocked``).
* :class:`Schedule` is one row per recurring task (``@queue_task(cron=...)``).
* :class:`UniqueKey` is one row per dedup key taken for a period after its message
  succeeded (``unique_for``); :class:`RateLimit` one per rate-limit key (``keytables``).

Rows change state only through :mod:`django_mysqlq.broker`; the QuerySets here
are for reading (stuck claims need the process list: ``broker.stuck_messages()``).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models

from . import gating
from .gatemodels import GATE_ID_LENGTH, Gate, gate_id
from .keytables import RateLimit, UniqueKey, rate_id, unique_key_id
from .managers import BoundManager

#: Name of the index the claim statement is pinned to (``FORCE INDEX``).
CLAIM_INDEX = "mysqlq_msg_claim"


class MessageStatus(models.TextChoices):
    READY = "ready", "Ready"
    SCHEDULED = "scheduled", "Scheduled"
    CLAIMED = "claimed", "Claimed (running)"
    #: Waiting for a slot of its gate: behind an earlier message of its ordered subject,
    #: or for a free slot of its concurrency key.
    BLOCKED = "blocked", "Blocked"
    #: Due, waiting for its rate limit's next start (``rate_limit``): claimed one at a
    #: time per key when the key's row allows (``broker.rates``), never 'ready'.
    THROTTLED = "throttled", "Throttled (rate limit)"
    DEAD = "dead", "Dead"


class Outcome(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"
    #: The attempt failed and the message was scheduled for another one.
    RETRIED = "retried", "Failed, retried"
    #: The attempt failed and the message is out of attempts (now dead).
    FAILED = "failed", "Failed, dead"
    #: The worker running it vanished; the message went back to the queue.
    LOST = "lost", "Lost (worker died)"
    CANCELLED = "cancelled", "Cancelled"
    # Operator actions: rows written by the admin or the CLI, with ``actor`` set.
    REQUEUED = "requeued", "Requeued by an operator"
    RELEASED = "released", "Stuck claim released by an operator"
    PRIORITY = "priority", "Priority changed by an operator"
    REPLAYED = "replayed", "Replayed (a copy enqueued) by an operator"
    #: A worker that didn't know the task gave the message back for later (rolling deploy).
    DEFERRED = "deferred", "Given back: the worker didn't know its task"
    #: An operator released the ordered subject its dead head held: the head stays dead.
    SKIPPED = "skipped", "Dead head skipped: its subject released by an operator"


#: Outcomes that record an attempt run by a worker (the rest are operator actions).
ATTEMPT_OUTCOMES = (Outcome.SUCCEEDED, Outcome.RETRIED, Outcome.FAILED, Outcome.LOST)
#: Statuses an operator may requeue, cancel or re-prioritise: never a running message.
OPERABLE_STATUSES = (MessageStatus.READY, MessageStatus.SCHEDULED, MessageStatus.DEAD)
#: Statuses an operator may cancel or re-prioritise: a blocked message too (a requeue
#: would make it jump the order it waits in), and a throttled one (waiting for its rate
#: limit's next start: it holds nothing, so deleting it leaks nothing).
CANCELLABLE_STATUSES = (*OPERABLE_STATUSES, MessageStatus.BLOCKED, MessageStatus.THROTTLED)


class GateMode(models.TextChoices):
    """How a message passes its gate (see docs/ordering.md)."""

    #: An ordered subject whose dead head holds it (``on_dead="hold"``, the default).
    HOLD = gating.HOLD, "Ordered subject (a dead head holds it)"
    #: An ordered subject that skips a dead head (``on_dead="skip"``).
    SKIP = gating.SKIP, "Ordered subject (skips a dead head)"
    #: A concurrency key: at most ``gate_limit`` of its messages at once, in no set order.
    LIMIT = gating.LIMIT, "Concurrency key"


#: Modes of ordered subjects (one message at a time, in enqueue order).
ORDERED_MODES = (GateMode.HOLD, GateMode.SKIP)


class MessageQuerySet(models.QuerySet["Message"]):
    def ready(self) -> MessageQuerySet:
        return self.filter(status=MessageStatus.READY)

    def scheduled(self) -> MessageQuerySet:
        return self.filter(status=MessageStatus.SCHEDULED)

    def claimed(self) -> MessageQuerySet:
        return self.filter(status=MessageStatus.CLAIMED)

    def dead(self) -> MessageQuerySet:
        return self.filter(status=MessageStatus.DEAD)

    def in_queue(self, queue: str) -> MessageQuerySet:
        return self.filter(queue=queue)


class Message(models.Model):
    """One unfinished message: ready, scheduled, claimed, blocked or dead."""

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=64)
    task_name = models.CharField(max_length=255)
    #: ``{"args": [...], "kwargs": {...}}`` as JSON text. Text, not a JSON column, so a
    #: corrupt payload can be stored and is then failed by the worker, not by the driver.
    payload = models.TextField()
    status = models.CharField(max_length=10, choices=MessageStatus.choices)
    #: -100..100, higher runs first.
    priority = models.SmallIntegerField(default=0)
    enqueued_at = models.DateTimeField()
    #: When a scheduled message becomes ready (also set for ready ones).
    run_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    #: Base delay of the exponential retry backoff, in seconds.
    retry_backoff = models.FloatField()
    #: Seconds after which a running attempt is reported as overrunning (null: never).
    timeout = models.FloatField(null=True, blank=True)
    #: At most one unfinished message per key; NULL (no key) never collides, '' would.
    dedup_key = models.CharField(max_length=255, null=True, blank=True, unique=True)
    #: Seconds its dedup key stays taken after it succeeds (:class:`UniqueKey`); 0: the
    #: key is free again once it finished (unique while queued).
    unique_for = models.PositiveIntegerField(default=0, db_default=0)
    #: Its rate-limit key (:class:`RateLimit`) and the microseconds between two starts of
    #: that key; NULL for a message without a rate limit. Compared exactly.
    rate_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    rate_interval = models.PositiveBigIntegerField(null=True, blank=True)
    #: The ordered subject or concurrency key this message passes (with ``gate_mode``);
    #: NULL for a message that passes no gate. Compared exactly (binary collation).
    gate_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    gate_mode = models.CharField(max_length=5, choices=GateMode.choices, null=True,  # noqa: DJ001
                                 blank=True)
    #: How many messages of its gate may hold a slot at once (1 for an ordered subject).
    gate_limit = models.PositiveIntegerField(null=True, blank=True)

    # The claim: who holds the message and until when.
    claim_token = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
    owner_connection = models.PositiveBigIntegerField(null=True, blank=True)
    #: Epoch seconds when the owner's server started: connection ids restart after a reboot.
    owner_server_start = models.BigIntegerField(null=True, blank=True)
    worker_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    #: When the current attempt started on its worker, as the worker recorded it (within
    #: about a second of the start, or before the start for a message lost once): recovery
    #: counts a lost attempt only for a message that started.
    started_at = models.DateTimeField(null=True, blank=True)
    #: Times a worker vanished while holding it. A message lost before runs alone in its
    #: worker process, so a task that kills its process can't take neighbours down again.
    losses = models.PositiveSmallIntegerField(default=0, db_default=0)
    #: Times a worker that didn't know its task gave it back (rolling deploys).
    deferrals = models.PositiveSmallIntegerField(default=0, db_default=0)

    last_error = models.TextField(blank=True, default="")

    objects = BoundManager.from_queryset(MessageQuerySet)()

    class Meta:
        db_table = "mysqlq_message"
        indexes = [
            # Equality prefix then exactly the claim's ORDER BY, directions included.
            models.Index(fields=["queue", "status", "-priority", "id"], name=CLAIM_INDEX),
            models.Index(fields=["status", "run_at"], name="mysqlq_msg_due"),
            models.Index(fields=["claim_token"], name="mysqlq_msg_token"),
            models.Index(fields=["status", "lease_expires_at"], name="mysqlq_msg_lease"),
            models.Index(fields=["worker_id"], name="mysqlq_msg_worker"),
            # The admin's task filter: its choices (a loose index scan) and its lists,
            # with or without a status, in (status, id) order. Ascending, unlike the claim
            # index: MariaDB's loose scan refuses an index with a descending part.
            models.Index(fields=["task_name", "status"], name="mysqlq_msg_task"),
            # A gate's messages in enqueue order: the next blocked one, the heads. No
            # status column, so the hot path (claims of messages without a gate) never
            # rewrites an entry here.
            models.Index(fields=["gate_key", "id"], name="mysqlq_msg_gate"),
            # A rate key's next message, in enqueue order (no status: see the gate index).
            models.Index(fields=["rate_key", "id"], name="mysqlq_msg_rate"),
        ]
        permissions = [
            ("requeue_message", "Can requeue a message or retry a dead one"),
            ("cancel_message", "Can cancel a ready, scheduled or dead message"),
            ("change_priority", "Can change the priority of a waiting message"),
            ("release_message", "Can release the claim of a stuck message"),
            ("replay_attempt", "Can replay a finished message from history"),
            ("pause_queue", "Can pause and resume a queue"),
            ("release_subject", "Can release an ordered subject held by its dead head"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} #{self.pk} ({self.status})"

    def decoded_payload(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.payload)
        return value


class AttemptQuerySet(models.QuerySet["Attempt"]):
    def succeeded(self) -> AttemptQuerySet:
        return self.filter(outcome=Outcome.SUCCEEDED)

    def failed(self) -> AttemptQuerySet:
        return self.filter(outcome__in=[Outcome.FAILED, Outcome.RETRIED])

    def lost(self) -> AttemptQuerySet:
        return self.filter(outcome=Outcome.LOST)

    def for_message(self, message_id: int) -> AttemptQuerySet:
        return self.filter(message_id=message_id).order_by("id")


class Attempt(models.Model):
    """One attempt at a message (or one operator action on it): the history."""

    id = models.BigAutoField(primary_key=True)
    #: Not a foreign key: the message row is gone once it finished.
    message_id = models.BigIntegerField()
    queue = models.CharField(max_length=64)
    task_name = models.CharField(max_length=255)
    attempt = models.PositiveIntegerField()
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    priority = models.SmallIntegerField(default=0)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()
    # Who ran it.
    worker_id = models.CharField(max_length=200, blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    connection_id = models.PositiveBigIntegerField(null=True, blank=True)
    thread = models.CharField(max_length=100, blank=True, default="")
    # What happened.
    error_class = models.CharField(max_length=255, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    #: The message's payload, kept on final rows so a finished message can be replayed.
    payload = models.TextField(blank=True, default="")
    #: Who did it, for operator actions ("admin:alice", "cli:root"); empty for attempts.
    #: A database default too: the broker's raw INSERTs (and older workers) omit it.
    actor = models.CharField(max_length=200, blank=True, default="", db_default="")
    #: On a ``replayed`` row: the message this one is a copy of (the pipeline's replay
    #: skips originals that already have one, so a re-run enqueues nothing twice).
    replayed_from = models.BigIntegerField(null=True, blank=True)

    objects = BoundManager.from_queryset(AttemptQuerySet)()

    class Meta:
        db_table = "mysqlq_attempt"
        indexes = [
            models.Index(fields=["message_id", "id"], name="mysqlq_att_message"),
            # Covers the dashboard's window query (no row lookups however busy the last
            # hour was); its prefix serves retention and date filters.
            models.Index(fields=["finished_at", "queue", "outcome", "task_name"],
                         name="mysqlq_att_finished"),
            models.Index(fields=["outcome", "finished_at"], name="mysqlq_att_outcome"),
            models.Index(fields=["task_name", "finished_at"], name="mysqlq_att_task"),
            models.Index(fields=["queue", "finished_at"], name="mysqlq_att_queue"),
            models.Index(fields=["replayed_from"], name="mysqlq_att_replayed"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} #{self.message_id} attempt {self.attempt}: {self.outcome}"


class WorkerQuerySet(models.QuerySet["Worker"]):
    def running(self) -> WorkerQuerySet:
        return self.filter(stopped_at__isnull=True)


class Worker(models.Model):
    """A worker process, as it registered itself; ``last_heartbeat`` says it is alive."""

    id = models.CharField(max_length=200, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    #: Comma-separated, in claim order. Text: a worker serving every known queue may list
    #: many, and every name must be whole for wake-ups (FIND_IN_SET) and the unserved check.
    queues = models.TextField()
    concurrency = models.PositiveIntegerField()
    connection_id = models.PositiveBigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    #: Idle and parked in a SLEEP on ``connection_id``: producers wake it with KILL QUERY.
    listening = models.BooleanField(default=False)
    #: The cluster node that connection is on (a Galera node's ``wsrep_gcomm_uuid``), empty
    #: on a single server: connection ids mean something only on their own node, so a
    #: producer on another node wakes it through its row instead (``broker.park``).
    node = models.CharField(max_length=64, blank=True, default="", db_default="")
    processed = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)
    #: What keeps failing in the worker now (an upkeep step, a broadcast read, a group's
    #: pump), one line each with since when: written at each heartbeat, emptied when it
    #: works again or the worker stops (``worker.troubles``). The log says each once.
    troubles = models.TextField(blank=True, default="", db_default="")

    objects = BoundManager.from_queryset(WorkerQuerySet)()

    class Meta:
        db_table = "mysqlq_worker"
        indexes = [models.Index(fields=["last_heartbeat"], name="mysqlq_wrk_heartbeat")]

    def __str__(self) -> str:
        return self.id


class QueueState(models.Model):
    """A queue an operator paused (or resumed): workers skip paused queues when claiming.

    Only queues an operator touched have a row; every other queue is running.
    """

    queue = models.CharField(max_length=64, primary_key=True)
    paused = models.BooleanField(default=False)
    changed_at = models.DateTimeField()
    changed_by = models.CharField(max_length=200, blank=True, default="")

    objects = BoundManager["QueueState"]()

    class Meta:
        db_table = "mysqlq_queue"
        verbose_name = "queue"
        verbose_name_plural = "queues (dashboard)"

    def __str__(self) -> str:
        return f"{self.queue} ({'paused' if self.paused else 'running'})"


class Schedule(models.Model):
    """A recurring task: the code declares it, workers enqueue each occurrence once.

    Workers write a row per schedule their code declares when they start (and mark the
    rest ``removed_at``); the row then holds what each occurrence's message is made of,
    so any worker can enqueue it, and ``next_run_at``, the first occurrence not yet
    enqueued. Enqueuing an occurrence and moving ``next_run_at`` on is one transaction
    whose ``UPDATE … WHERE name = %s AND next_run_at = %s`` only one worker can win.
    """

    name = models.CharField(max_length=255, primary_key=True)
    #: ``code`` (``@queue_task(cron=...)``) or ``settings`` (``MYSQLQ['SCHEDULES']``).
    source = models.CharField(max_length=8)
    # What each occurrence's message is made of.
    task_name = models.CharField(max_length=255)
    queue = models.CharField(max_length=64)
    priority = models.SmallIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    retry_backoff = models.FloatField()
    timeout = models.FloatField(null=True, blank=True)
    payload = models.TextField()
    # When.
    cron = models.CharField(max_length=255)
    timezone = models.CharField(max_length=64)
    #: ``skip``, ``latest`` or ``all``: what happens to occurrences missed while no
    #: worker ran (see docs/schedules.md).
    catch_up = models.CharField(max_length=6)
    paused = models.BooleanField(default=False)
    #: The first occurrence not enqueued yet (UTC); NULL until a worker computes it.
    next_run_at = models.DateTimeField(null=True, blank=True)
    #: The last occurrence enqueued, when it was enqueued, and its message.
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_enqueued_at = models.DateTimeField(null=True, blank=True)
    last_message_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    #: When a starting worker last found it in its code.
    declared_at = models.DateTimeField()
    #: Set when a worker started without it in its code: it no longer fires.
    removed_at = models.DateTimeField(null=True, blank=True)
    #: Why workers can't compute its occurrences (a row changed by hand); '' when fine.
    error = models.TextField(blank=True, default="")
    changed_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.CharField(max_length=200, blank=True, default="")

    objects = BoundManager["Schedule"]()

    class Meta:
        db_table = "mysqlq_schedule"
        ordering = ["name"]
        permissions = [("pause_schedule", "Can pause, resume and prune recurring tasks")]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"


class Lease(models.Model):
    """A duty one process holds at a time across a cluster, where ``GET_LOCK`` is per node:
    the recovery sweep. Taken and renewed by a conditional ``UPDATE``; it lapses at
    ``expires_at`` unless its holder renews it (``broker.leader``)."""

    name = models.CharField(max_length=100, primary_key=True)
    holder = models.CharField(max_length=255)
    expires_at = models.DateTimeField()

    objects = BoundManager["Lease"]()

    class Meta:
        db_table = "mysqlq_lease"

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder} until {self.expires_at}"



class StuckMessage(Message):
    """Admin entry point: claimed messages whose owner is gone, lease-expired or overrunning."""

    class Meta:
        proxy = True
        verbose_name = "stuck message"
        verbose_name_plural = "stuck messages"


class DeadMessage(Message):
    """Admin entry point: messages out of attempts, kept with their last error."""

    class Meta:
        proxy = True
        verbose_name = "dead message"
        verbose_name_plural = "dead messages"


class BlockedMessage(Message):
    """Admin entry point: messages waiting for their gate, with the head that holds them."""

    class Meta:
        proxy = True
        verbose_name = "blocked message"
        verbose_name_plural = "blocked messages"



# Topics: their tables are in topicmodels.py (this module would pass 500 lines).
from .topicmodels import (  # noqa: E402
    TopicDelivery,
    TopicGroup,
    TopicMessage,
    TopicStart,
    TopicState,
)

__all__ = [
    "GATE_ID_LENGTH", "Attempt", "BlockedMessage", "DeadMessage", "Gate", "Lease", "Message",
    "QueueState", "RateLimit", "Schedule", "StuckMessage", "TopicDelivery", "TopicGroup",
    "TopicMessage", "TopicStart", "TopicState", "UniqueKey", "Worker", "gate_id", "rate_id",
    "unique_key_id",
]
