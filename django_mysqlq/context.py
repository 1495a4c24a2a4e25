"""What ``@queue_task(takes_context=True)`` passes as the function's first argument."""

from __future__ import annotations

import dataclasses
import datetime as dt

from .messages import ClaimedMessage

#: ``gate_mode`` values of an ordered subject (``models.GateMode``), once messages carry one.
_ORDERED_MODES = ("hold", "skip")


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """The attempt a task function is running in."""

    message_id: int
    task_name: str
    queue: str
    #: This attempt's number, from 1; ``max_attempts`` counts the first one too.
    attempt: int
    max_attempts: int
    enqueued_at: dt.datetime
    #: The message's ordered subject, or None (no subject, or a release without them).
    subject: str | None = None

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure now makes the message dead instead of retried."""
        return self.attempt >= self.max_attempts

    @classmethod
    def of(cls, message: ClaimedMessage) -> TaskContext:
        return cls(message_id=message.id, task_name=message.task_name, queue=message.queue,
                   attempt=message.attempt, max_attempts=message.max_attempts,
                   enqueued_at=message.enqueued_at, subject=subject_of(message))


def subject_of(message: ClaimedMessage) -> str | None:
    """The ordered subject a claimed message carries, if messages carry one at all."""
    if getattr(message, "gate_mode", None) not in _ORDERED_MODES:
        return None
    key = getattr(message, "gate_key", None)
    return key if isinstance(key, str) else None
