"""Which queues a worker serves when ``--queues`` is left out (or is ``'*'``).

Every queue a task this process knows uses: each ``@queue_task``'s queue (after the task
modules are imported), ``MYSQLQ['DEFAULT_QUEUE']``, and the queues of Django's tasks on
``MySQLQueueBackend`` (``backend.queues``). They are claimed in name order.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from .. import broker
from ..backend.queues import declared_queues
from ..conf import get_settings
from ..log import one_line
from ..registry import import_task_modules, registry
from ..routing import group_by_alias
from ..topicnames import group_of_queue
from . import fatal

logger = logging.getLogger("django_mysqlq")

#: ``--queues '*'``: every known queue, the same as leaving ``--queues`` out.
ALL = "*"


def known_queues() -> set[str]:
    """The queues of every task this process knows (imports the task modules first)."""
    import_task_modules()
    return registry.queues() | {get_settings().DEFAULT_QUEUE} | declared_queues()


def placed_queues() -> set[str]:
    """:func:`known_queues` for ``routing.queue_aliases()`` (migrate, ``drain()``,
    ``--database``, the admin): a task module that fails to import is left out, not
    raised (the system check ``django_mysqlq.E005`` names it)."""
    try:
        return known_queues()
    except ImproperlyConfigured:
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
        group = group_of_queue(queue)
        if queue not in known and group is not None:
            groups = sorted({g for q in known if (g := group_of_queue(q)) is not None})
            logger.warning(
                "%s: group %r is served (queue %r), but no handler this worker knows is "
                "subscribed with group=%r (subscribed groups: %s): nothing will be "
                "delivered to it. A typo, or a task module not imported?", who, group, queue,
                group, ", ".join(groups) or "none")
        elif queue not in known:
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


def in_turn(queues: Sequence[str], groups: Collection[str], turn: int,
            held: Mapping[str, int] | None = None) -> list[str]:
    """``queues`` (a claim order) with the consumer groups' queues reordered among their
    own places: the group holding the fewest of the worker's claims (``held``, by queue)
    first, ties in turn (rotated by ``turn``). Task queues keep the order given: it is
    their priority. A group with a backlog claimed first at every round would keep the
    worker's other groups waiting until it ran dry; taken in turn by claims alone, a
    slow handler's group would still fill the threads and set a fast one's pace."""
    places = [index for index, queue in enumerate(queues) if queue in groups]
    order = list(queues)
    if len(places) < 2:
        return order
    shift = turn % len(places)
    rotated = [queues[source] for source in [*places[shift:], *places[:shift]]]
    if held:
        rotated.sort(key=lambda queue: held.get(queue, 0))  # (stable: ties keep their turn)
    for place, queue in zip(places, rotated, strict=True):
        order[place] = queue
    return order
