"""A consumer group's dead letter: its dead deliveries (dead messages of the task
``topic:<topic>:<group>``), listed and requeued."""

from __future__ import annotations

from collections.abc import Sequence

from ..models import MessageStatus
from ..topicnames import delivery_task_name
from .base import MESSAGE_TABLE, connection_for, default_alias, placeholders
from .operate import Operator, requeue

#: Dead letters are read and requeued this many at a time.
DEAD_BATCH = 1000
#: Dead deliveries of one group and topic (its dead letter) after an id, oldest first.
DEAD_DELIVERIES_SQL = (
    f"SELECT m.id FROM {MESSAGE_TABLE} m FORCE INDEX (mysqlq_msg_task) "
    "WHERE m.task_name = %s AND m.status = 'dead' AND m.id > %s ORDER BY m.id LIMIT %s"
)
#: Which of some ids are messages of one task (in any status).
OF_TASK_SQL = f"SELECT id FROM {MESSAGE_TABLE} WHERE task_name = %s AND id IN ({{ids}})"


def dead_deliveries(topic: str, group: str, limit: int = DEAD_BATCH,
                    alias: str | None = None) -> list[int]:
    """Ids of the group's dead deliveries of ``topic`` (its dead letter), oldest first:
    the first ``limit`` of them only (1,000 by default; the dead letter may hold more)."""
    return dead_deliveries_by_task(delivery_task_name(topic, group), limit, alias)


def requeue_dead(task_name: str, operator: Operator, ids: Sequence[int] | None = None, *,
                 reset_attempts: bool = False) -> list[int]:
    """Requeue dead deliveries of one group and topic (task ``topic:<topic>:<group>``):
    ``ids``, or its whole dead letter; return the ids requeued. Each gets one more
    attempt, or a full set with ``reset_attempts``; the history says who did it.

    The whole dead letter is walked by id, 1,000 at a time, from the oldest: each
    delivery dead when the walk reaches it is requeued once, even if it goes dead again
    (a member whose handler still fails) before the walk ends. Of ``ids``, those of
    another task, or not dead (or gone), are left alone and not in the result."""
    if ids is None:
        done: list[int] = []
        last = 0
        while batch := _dead_after(task_name, last, DEAD_BATCH):
            done.extend(requeue(batch, operator, reset_attempts=reset_attempts,
                                statuses=(MessageStatus.DEAD,)))
            last = batch[-1]
        return done
    return requeue(_of_task(task_name, ids), operator, reset_attempts=reset_attempts,
                   statuses=(MessageStatus.DEAD,))


def dead_deliveries_by_task(task_name: str, limit: int = DEAD_BATCH,
                            alias: str | None = None) -> list[int]:
    """The first ``limit`` dead messages of ``task_name``, oldest first."""
    return _dead_after(task_name, 0, limit, alias)


def _dead_after(task_name: str, last: int, limit: int, alias: str | None = None
                ) -> list[int]:
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(DEAD_DELIVERIES_SQL, [task_name, last, limit])
        return [int(row[0]) for row in cursor.fetchall()]


def _of_task(task_name: str, ids: Sequence[int]) -> list[int]:
    """The messages of ``task_name`` among ``ids``."""
    unique = sorted({int(i) for i in ids})
    found: list[int] = []
    with connection_for(default_alias()).cursor() as cursor:
        for start in range(0, len(unique), DEAD_BATCH):
            chunk = unique[start:start + DEAD_BATCH]
            cursor.execute(OF_TASK_SQL.format(ids=placeholders(len(chunk))),
                           [task_name, *chunk])
            found.extend(int(row[0]) for row in cursor.fetchall())
    return found
