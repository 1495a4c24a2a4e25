"""django-mysqlq: a transactional task queue for Django on MySQL/MariaDB.

Public API::

    from django_mysqlq import queue_task

    @queue_task(queue="emails", max_attempts=5)
    def send_welcome(user_id: int) -> None: ...

    send_welcome.enqueue(user.pk)  # joins the current transaction
"""

from .context import TaskContext
from .exceptions import (
    ArgumentEncodingError,
    InvalidTaskOptions,
    MessageDoesNotExist,
    PayloadTooLarge,
    QueueError,
    Retry,
    TaskAlreadyRegistered,
    TaskArgumentError,
    TaskTimeout,
    TransactionLeftOpen,
    UnknownTask,
    WaitTimeout,
)
from .handles import MessageHandle, MessageResult, MessageState
from .tasks import QueueTask, queue_task
from .topics import Topic, TopicEvent

__all__ = [
    "ArgumentEncodingError",
    "InvalidTaskOptions",
    "MessageDoesNotExist",
    "MessageHandle",
    "MessageResult",
    "MessageState",
    "PayloadTooLarge",
    "QueueError",
    "QueueTask",
    "Retry",
    "TaskAlreadyRegistered",
    "TaskArgumentError",
    "TaskContext",
    "TaskTimeout",
    "Topic",
    "TopicEvent",
    "TransactionLeftOpen",
    "UnknownTask",
    "WaitTimeout",
    "queue_task",
]
