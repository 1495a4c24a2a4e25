"""Which queues a worker serves when ``--queues`` is left out (or is ``'*'``).

Every queue a task this process knows uses: each ``@queue_task``'s queue (after the task
modules are imported), ``MYSQLQ['DEFAULT_QUEUE']``, and the queues of Django's tasks on
``MySQLQueueBackend`` (``backend.queues``). They are claimed in name order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import DatabaseError

from .. import broker
from ..backend.queues import declared_queues
from ..conf import get_settings
from ..log import one_line
from ..registry import import_task_modules, registry
from ..routing import group_by_alias
from . import fatal

logger = logging.getLogger("django_mysqlq")

#: ``--queues '*'``: every known queue, the same as leaving ``--queues`` out.
ALL = "*"


def known_queues() -> set[str]:
    """The queues of every task this process knows (imports the task modules first)."""
    import_task_modules()
    return registry.queues() | {get_settings().DEFAULT_QUEUE} | declared_queues()


def resolve(requested: Sequence[str] | None) -> tuple[str, ...]:
    """The queues to serve, in claim order: ``requested``, or every known one."""
    if not requested or list(requested) == [ALL]:
        return tuple(sorted(known_queues()))
    if ALL in requested:
        raise ValueError(f"'{ALL}' means every known queue: give it alone, not with "
                         f"{', '.join(q for q in requested if q != ALL)}.")
    return tuple(requested)


def report(who: str, queues: Sequence[str]) -> None:
    """Warn, at start, of asked-for queues no task uses and of ready work nobody serves.

    ``who`` starts the lines (``Worker <id>``, ``Supervisor <pid>``); ``queues`` (this
    worker's, or a supervisor's children's) count as served. A database
    error no retry fixes ends the worker (``fatal``); any other only skips the check.
    """
    known = known_queues()
    for queue in queues:
        if queue not in known:
            logger.warning(
                "%s: queue %r is served, but no task this worker knows uses it (known: %s); "
                "only .using(queue=%r) or a Django task's queue_name sends work there. A "
                "typo?", who, queue, ", ".join(sorted(known)), queue)
    for alias, served in group_by_alias(queues).items():
        with broker.on_alias(alias):
            _report_unserved(who, served)


def _report_unserved(who: str, queues: Sequence[str]) -> None:
    """Warn of ready work no worker serves on this thread's queue database."""
    try:
        unserved = broker.unserved_queues(also_served=queues)
    except DatabaseError as exc:
        fatal.check(exc, started=False, burst=False)
        logger.warning("%s: could not read which queues no worker serves (%s).", who,
                       one_line(str(exc)))
        broker.close_if_broken()
        return
    if unserved:
        logger.warning("%s: %s. Start a worker for them (runqueueworker --queues %s), or "
                       "check the names the tasks use.", who,
                       broker.describe_unserved(unserved),
                       ",".join(queue.queue for queue in unserved))
