"""The topics' tables (see docs/streams.md); :mod:`models` re-exports them.

A topic is a log of published messages; each consumer group turns it into ordinary queue
messages (deliveries) in its own queue, so retries, dead letters, recovery, ordering by
key, wake-ups and the attempt trace come from the queue.
"""

from __future__ import annotations

from django.db import models

from . import topicnames
from .managers import BoundManager


class TopicStart(models.TextChoices):
    """Where a consumer group begins when it is created."""

    #: After the last message sequenced when the group was created.
    LATEST = topicnames.LATEST, "Latest: messages published from now on"
    #: At the earliest message still kept.
    EARLIEST = topicnames.EARLIEST, "Earliest kept message"


class TopicState(models.Model):
    """One row per topic: the offset counter its sequencer moves under this row's lock.

    ``last_offset`` is the highest offset given out; ``first_offset`` the lowest still
    kept (retention moves it on). Offsets are dense: 1, 2, 3, … in sequencing order.
    """

    name = models.CharField(max_length=64, primary_key=True)
    last_offset = models.BigIntegerField(default=0)
    #: Lowest offset not yet deleted by retention (1 until retention ran).
    first_offset = models.BigIntegerField(default=1)
    created_at = models.DateTimeField()
    #: When the sequencer last gave out offsets (monitoring: the topic's last publish).
    sequenced_at = models.DateTimeField(null=True, blank=True)

    objects = BoundManager["TopicState"]()

    class Meta:
        db_table = "mysqlq_topic"
        verbose_name = "topic"

    def __str__(self) -> str:
        return self.name


class TopicMessage(models.Model):
    """One published message. ``offset`` is NULL until the sequencer stamps it.

    Publishers only INSERT (in their own transaction); the AUTO_INCREMENT id orders rows
    by insert, not by commit. The sequencer stamps committed rows with the topic's next
    offsets under the topic row's lock (``SKIP LOCKED`` passes rows still uncommitted),
    so a reader that has seen offset N never later finds a new row below N.
    """

    id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=64)
    #: Dense per topic, in sequencing order; NULL while not yet sequenced.
    offset = models.BigIntegerField(null=True, blank=True, db_column="msg_offset")
    #: Messages of one key are handled in offset order within a group. Exact collation.
    key = models.CharField(max_length=255, null=True, blank=True,  # noqa: DJ001
                           db_column="msg_key")
    #: JSON text, checked at publish (like task arguments).
    payload = models.TextField()
    published_at = models.DateTimeField()
    sequenced_at = models.DateTimeField(null=True, blank=True)

    objects = BoundManager["TopicMessage"]()

    class Meta:
        db_table = "mysqlq_topic_message"
        constraints = [
            # Also the sequencer's index: (topic, NULL offset, id) walks unsequenced rows
            # in insert order; groups read (topic, offset > position) in order.
            models.UniqueConstraint(fields=["topic", "offset"], name="mysqlq_tmsg_offset"),
        ]
        indexes = [
            models.Index(fields=["topic", "key", "offset"], name="mysqlq_tmsg_key"),
            models.Index(fields=["topic", "published_at"], name="mysqlq_tmsg_published"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}@{self.offset if self.offset is not None else '?'}"


class TopicGroup(models.Model):
    """A consumer group of a topic and its position: every offset up to ``position`` has
    been turned into a delivery (a queue message in ``queue``) of this group.

    The pump moves ``position`` in the transaction that inserts the deliveries, under
    this row's lock: each offset becomes a delivery of the group exactly once.
    """

    id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=64)
    group_name = models.CharField(max_length=64)
    #: The queue its deliveries go to (``group:<group>``), served by its members.
    queue = models.CharField(max_length=64)
    #: The start chosen at creation (latest or earliest).
    start = models.CharField(max_length=8, choices=TopicStart.choices,
                             default=TopicStart.LATEST)
    #: Last offset turned into a delivery (0: none yet).
    position = models.BigIntegerField(default=0)
    created_at = models.DateTimeField()
    #: Last time the pump moved the position.
    pumped_at = models.DateTimeField(null=True, blank=True)
    #: Operator changes of the position (reset, replay): when and who.
    changed_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.CharField(max_length=200, blank=True, default="")
    #: The last reset that moved the position forward (it skipped the offsets between):
    #: when and who. A replay or a reset backwards skips nothing and leaves these; a
    #: lookup's trace blames a move only on them.
    moved_forward_at = models.DateTimeField(null=True, blank=True)
    moved_forward_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    #: Why the group's pump can't go on, as its members last said (a failing statement, a
    #: message too big for a delivery), and since when.
    #: Cleared by the next pump that moves the position, and by a reset.
    pump_problem = models.TextField(blank=True, default="", db_default="")
    pump_problem_at = models.DateTimeField(null=True, blank=True)

    objects = BoundManager["TopicGroup"]()

    class Meta:
        db_table = "mysqlq_topic_group"
        verbose_name = "consumer group"
        constraints = [
            models.UniqueConstraint(fields=["topic", "group_name"], name="mysqlq_tgroup_unique"),
        ]
        indexes = [models.Index(fields=["queue"], name="mysqlq_tgroup_queue")]

    def __str__(self) -> str:
        return f"{self.topic} / {self.group_name} at {self.position}"


class TopicDelivery(models.Model):
    """Which topic message a delivery (a queue message) carries to which group.

    Written by the pump with the delivery; kept after the message is finished, so a
    topic message's trace is: its deliveries here, then their :class:`Attempt` rows by
    ``message_id`` (worker, outcome, times, error). Deleted with the topic message by
    retention.
    """

    #: The delivery's id in ``mysqlq_message`` (and ``mysqlq_attempt.message_id``).
    message_id = models.BigIntegerField(primary_key=True)
    topic = models.CharField(max_length=64)
    group_name = models.CharField(max_length=64)
    offset = models.BigIntegerField(db_column="msg_offset")
    created_at = models.DateTimeField()
    #: Made by an operator's replay (``queuetopic replay``, the admin's replay form); not
    #: set on the pump's deliveries, a reset's re-deliveries included.
    replay = models.BooleanField(default=False, db_default=False)

    objects = BoundManager["TopicDelivery"]()

    class Meta:
        db_table = "mysqlq_topic_delivery"
        indexes = [
            models.Index(fields=["topic", "offset"], name="mysqlq_tdel_offset"),
            models.Index(fields=["topic", "group_name", "offset"], name="mysqlq_tdel_group"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}@{self.offset} -> {self.group_name} (#{self.message_id})"
