"""Whether a queue or task name appears in the queue tables: the operator commands' check
of a name given to them (``queuepause emial``, ``--task`` of a Django task given without
its ``django.tasks:`` prefix). Each is one index dive (``LIMIT 1``), whatever the backlog.
"""

from __future__ import annotations

from .base import ATTEMPT_TABLE, MESSAGE_TABLE, connection_for

#: A waiting, running or dead message of the queue (along mysqlq_msg_claim).
QUEUE_MESSAGE_SQL = f"SELECT 1 FROM {MESSAGE_TABLE} WHERE queue = %s LIMIT 1"
#: A history row of the queue (along mysqlq_att_queue).
QUEUE_HISTORY_SQL = f"SELECT 1 FROM {ATTEMPT_TABLE} WHERE queue = %s LIMIT 1"
#: A waiting, running or dead message of the task (along mysqlq_msg_task).
TASK_MESSAGE_SQL = f"SELECT 1 FROM {MESSAGE_TABLE} WHERE task_name = %s LIMIT 1"
#: A history row of the task (along mysqlq_att_task).
TASK_HISTORY_SQL = f"SELECT 1 FROM {ATTEMPT_TABLE} WHERE task_name = %s LIMIT 1"


def _any(statement: str, name: str, alias: str | None) -> bool:
    with connection_for(alias).cursor() as cursor:
        cursor.execute(statement, [name])
        return cursor.fetchone() is not None


def queue_has_rows(queue: str, alias: str | None = None) -> bool:
    """Some message or history row on ``alias`` (default: the one in use) is of ``queue``."""
    return _any(QUEUE_MESSAGE_SQL, queue, alias) or _any(QUEUE_HISTORY_SQL, queue, alias)


def task_has_messages(task_name: str, alias: str | None = None) -> bool:
    """Some message (waiting, running or dead) on ``alias`` is of ``task_name``."""
    return _any(TASK_MESSAGE_SQL, task_name, alias)


def task_has_history(task_name: str, alias: str | None = None) -> bool:
    """Some history row on ``alias`` is of ``task_name`` (it ran, or was cancelled)."""
    return _any(TASK_HISTORY_SQL, task_name, alias)
