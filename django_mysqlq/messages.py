"""The message types every layer passes around.

They sit below ``tasks``, ``broker``, ``models`` and ``handles`` and import none of
them, so those modules can all use them without importing one another in a circle.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any


@dataclasses.dataclass(frozen=True)
class NewMessage:
    """Everything the broker needs to insert one message."""

    task_name: str
    queue: str
    priority: int
    payload: str
    #: Absolute time to run at, or None for now + ``delay`` on the database clock.
    run_at: dt.datetime | None
    delay: float
    max_attempts: int
    retry_backoff: float
    timeout: float | None
    dedup_key: str | None
    #: The ordered subject or concurrency key it passes (see ``models.GateMode``), if any.
    gate_key: str | None = None
    gate_mode: str | None = None
    #: Messages of the gate that may hold a slot at once (1 for an ordered subject).
    gate_limit: int | None = None
    #: Seconds its dedup key stays taken after it succeeds (0: only while it is queued).
    unique_for: int = 0
    #: Its rate-limit key, the microseconds between two starts of that key, and the limit
    #: as declared ("100/m"); None for a message without a rate limit.
    rate_key: str | None = None
    rate_interval: int | None = None
    rate_limit: str = ""


@dataclasses.dataclass(frozen=True)
class ClaimedMessage:
    """A message this worker holds, as read back by its claim token."""

    id: int
    queue: str
    task_name: str
    payload: str
    priority: int
    attempt: int
    max_attempts: int
    retry_backoff: float
    timeout: float | None
    enqueued_at: dt.datetime
    claim_token: str
    #: The claiming connection's id; None behind a proxy, where ids are the proxy's.
    connection_id: int | None
    #: Times a worker vanished while holding it: a message lost before runs alone.
    losses: int = 0
    #: Its ordered subject or concurrency key, if any: its ack frees the slot.
    gate_key: str | None = None
    gate_mode: str | None = None
    #: Its dedup key, and the seconds that key stays taken after its success (the ack
    #: writes the period: see ``broker.unique``).
    dedup_key: str | None = None
    unique_for: int = 0


@dataclasses.dataclass(frozen=True)
class Runner:
    """Who ran an attempt: written into its history row."""

    worker_id: str
    host: str
    pid: int
    thread: str


@dataclasses.dataclass(frozen=True)
class AttemptResult:
    """How one attempt ended, as the worker saw it."""

    started_at: dt.datetime
    error_class: str = ""
    error_message: str = ""
    traceback: str = ""
    result: Any = None
