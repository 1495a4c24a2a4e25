"""The tables of keys beside the messages: unique keys kept after a success, and the
rate-limit keys. ``models`` imports them (Django finds models there); this module imports
nothing of the package."""

from __future__ import annotations

import hashlib

from django.db import models

from .managers import BoundManager

#: Hex digits of a key row's id (128 bits of SHA-256), as for gates.
KEY_ID_LENGTH = 32


def unique_key_id(dedup_key: str) -> str:
    """The primary key of a :class:`UniqueKey`: a digest of the dedup key."""
    return hashlib.sha256(dedup_key.encode("utf-8")).hexdigest()[:KEY_ID_LENGTH]


def rate_id(queue: str, rate_key: str) -> str:
    """The primary key of a :class:`RateLimit`: a digest of its queue and key."""
    return hashlib.sha256(f"{queue}\x00{rate_key}".encode()).hexdigest()[:KEY_ID_LENGTH]


class UniqueKey(models.Model):
    """A dedup key kept taken after its message succeeded (``unique_for``): written by the
    ack, checked by enqueues with ``unique_for``, deleted by retention once expired (see
    ``broker.unique``). The primary key is a digest (:func:`unique_key_id`), as for gates:
    an upsert on a primary key locks the one row, never a gap beside it.
    """

    id = models.CharField(max_length=KEY_ID_LENGTH, primary_key=True)
    dedup_key = models.CharField(max_length=255)
    #: The message that succeeded (0 on a row an enqueue made: no period runs).
    message_id = models.BigIntegerField()
    task_name = models.CharField(max_length=255, blank=True, default="")
    queue = models.CharField(max_length=64, blank=True, default="")
    succeeded_at = models.DateTimeField(null=True, blank=True)
    #: Until when the key stays taken (UTC). In the past: free.
    expires_at = models.DateTimeField()

    objects = BoundManager["UniqueKey"]()

    class Meta:
        app_label = "django_mysqlq"
        db_table = "mysqlq_unique_key"
        verbose_name = "unique key"
        verbose_name_plural = "unique keys (taken after success)"
        indexes = [models.Index(fields=["expires_at"], name="mysqlq_uniq_expires")]

    def __str__(self) -> str:
        return f"{self.dedup_key} (until {self.expires_at})"


class RateLimit(models.Model):
    """One rate-limit key of a queue (``@queue_task(rate_limit=...)``): the earliest time
    its next message may start. A worker claims a throttled message of the key only under
    this row's lock, when ``next_at`` has come, and moves ``next_at`` one interval past
    the later of itself and now, in the same transaction (``broker.rates``). A worker
    that dies after a claim holds nothing: the row only says when the next start may be.
    Producers make the row (``INSERT … ON DUPLICATE KEY``); retention deletes rows whose
    key has no message left.
    """

    id = models.CharField(max_length=KEY_ID_LENGTH, primary_key=True)
    queue = models.CharField(max_length=64)
    rate_key = models.CharField(max_length=255)
    #: The limit as the task declared it (``"100/m"``), for the admin.
    rate_limit = models.CharField(max_length=32, blank=True, default="")
    next_at = models.DateTimeField()
    changed_at = models.DateTimeField()

    objects = BoundManager["RateLimit"]()

    class Meta:
        app_label = "django_mysqlq"
        db_table = "mysqlq_rate"
        verbose_name = "rate-limit key"
        verbose_name_plural = "rate-limit keys"
        indexes = [models.Index(fields=["queue", "next_at"], name="mysqlq_rate_due")]

    def __str__(self) -> str:
        return f"{self.queue}: rate key {self.rate_key} ({self.rate_limit})"
