"""What ``enqueue()`` returns: a message id and a way to read its state later."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from asgiref.sync import sync_to_async

from .exceptions import MessageDoesNotExist


@dataclasses.dataclass(frozen=True)
class MessageState:
    """A message as it is now: in the hot table, or finished (from its last history row).

    ``status`` is one of ``ready``, ``scheduled``, ``claimed``, ``blocked``, ``dead``
    (unfinished) or ``succeeded``, ``cancelled`` (finished).
    """

    id: int
    task_name: str
    queue: str
    status: str
    attempts: int
    enqueued_at: dt.datetime
    run_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_error: str
    result: Any

    @property
    def is_finished(self) -> bool:
        """True when nothing more will happen without an operator: succeeded, cancelled, dead."""
        return self.status in ("succeeded", "cancelled", "dead")


def read_state(message_id: int) -> MessageState:
    """The current state of one message, or :class:`MessageDoesNotExist`."""
    from .conf import get_settings
    from .models import Attempt, Message

    db = get_settings().DATABASE
    message = Message.objects.using(db).filter(pk=message_id).first()
    if message is not None:
        return MessageState(
            id=message.pk,
            task_name=message.task_name,
            queue=message.queue,
            status=message.status,
            attempts=message.attempts,
            enqueued_at=message.enqueued_at,
            run_at=message.run_at,
            finished_at=None,
            last_error=message.last_error,
            result=None,
        )
    last = Attempt.objects.using(db).for_message(message_id).last()
    if last is None:
        raise MessageDoesNotExist(
            f"No message {message_id} exists: it was never committed (its transaction "
            "rolled back), or its history was purged."
        )
    return MessageState(
        id=message_id,
        task_name=last.task_name,
        queue=last.queue,
        status=last.outcome,
        attempts=last.attempt,
        enqueued_at=last.enqueued_at,
        run_at=None,
        finished_at=last.finished_at,
        last_error=last.error_message,
        result=last.result,
    )


@dataclasses.dataclass(frozen=True)
class MessageHandle:
    """The id of an enqueued message, and its task name."""

    id: int
    task_name: str

    def state(self) -> MessageState:
        return read_state(self.id)

    async def astate(self) -> MessageState:
        return await sync_to_async(read_state)(self.id)

    @property
    def status(self) -> str:
        return self.state().status
