"""django-mysqlq: a transactional task queue for Django on MySQL/MariaDB.

Public API::

    from django_mysqlq import queue_task

    @queue_task(queue="emails", max_attempts=5)
    def send_welcome(user_id: int) -> None: ...

    send_welcome.enqueue(user.pk)  # joins the current transaction
"""

from .exceptions import (
    ArgumentEncodingError,
    InvalidTaskOptions,
    MessageDoesNotExist,
    PayloadTooLarge,
    QueueError,
    TaskAlreadyRegistered,
    TaskArgumentError,
    TaskTimeout,
    TransactionLeftOpen,
    UnknownTask,
)
from .handles import MessageHandle, MessageState
from .tasks import QueueTask, queue_task

__all__ = [
    "ArgumentEncodingError",
    "InvalidTaskOptions",
    "MessageDoesNotExist",
    "MessageHandle",
    "MessageState",
    "PayloadTooLarge",
    "QueueError",
    "QueueTask",
    "TaskAlreadyRegistered",
    "TaskArgumentError",
    "TaskTimeout",
    "TransactionLeftOpen",
    "UnknownTask",
    "queue_task",
]
