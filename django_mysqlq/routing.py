"""Which database alias holds a queue, and which aliases hold queues at all.

A queue's alias is, first to answer wins:

1. ``MYSQLQ['QUEUES'][queue]['DATABASE']``;
2. the first router in ``DATABASE_ROUTERS`` with a ``db_for_queue(queue)`` method that
   returns an alias (not None);
3. ``MYSQLQ['DATABASE']``.

Routers are asked through a method of their own, not ``db_for_write``: a primary/replica
router that sends every write to ``"primary"`` must not move the queue by accident.
Everything is read per call (a dict look-up, and one call per router that has the method),
so ``override_settings`` and tests see the change at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator

from django.db import router

from .conf import get_settings

_bound = threading.local()


def bound_alias() -> str | None:
    """This thread's queue database, if one is bound (a worker's threads, an admin page)."""
    return getattr(_bound, "name", None)


def bind_alias(alias: str | None) -> None:
    """Make ``alias`` this thread's queue database (None: ``MYSQLQ['DATABASE']``)."""
    _bound.name = alias


@contextlib.contextmanager
def on_alias(alias: str | None) -> Iterator[None]:
    """The queue's statements and ORM reads (with :class:`QueueRouter`) that name no alias
    go to ``alias`` on this thread until the block ends."""
    previous = bound_alias()
    _bound.name = alias or previous
    try:
        yield
    finally:
        _bound.name = previous


def _routed(queue: str) -> str | None:
    for each in router.routers:
        method = getattr(each, "db_for_queue", None)
        if method is None:
            continue
        chosen = method(queue)
        if chosen:
            return str(chosen)
    return None


def alias_for_queue(queue: str) -> str:
    """The database alias that holds ``queue``'s messages."""
    conf = get_settings()
    entry = conf.QUEUES.get(queue)
    if entry is not None and entry.get("DATABASE"):
        return str(entry["DATABASE"])
    return _routed(queue) or conf.DATABASE


def group_by_alias(queues: Iterable[str]) -> dict[str, list[str]]:
    """``queues`` grouped by their alias, each group in the given order; the aliases in the
    order their first queue came."""
    groups: dict[str, list[str]] = {}
    for queue in queues:
        groups.setdefault(alias_for_queue(queue), []).append(queue)
    return groups


def add_queue_source(source: Callable[[], Iterable[str]]) -> None:
    """Have :func:`queue_aliases` also place the queues ``source()`` names (the app's
    ``ready()`` adds the queues of the tasks this process knows: this module can't import
    the registry and the Tasks backend without an import cycle)."""
    if source not in _queue_sources:
        _queue_sources.append(source)


_queue_sources: list[Callable[[], Iterable[str]]] = []


def queue_aliases(also: Iterable[str] = ()) -> tuple[str, ...]:
    """Every alias that holds queues: ``MYSQLQ['DATABASE']`` first, then those of
    ``MYSQLQ['QUEUES']``, of the queues of the tasks this process knows (placed by a
    router's ``db_for_queue`` too) and of the queues ``also`` names, in name order."""
    conf = get_settings()
    known = [queue for source in _queue_sources for queue in source()]
    found = {alias_for_queue(queue) for queue in [*conf.QUEUES, *known, *also]}
    return (conf.DATABASE, *sorted(found - {conf.DATABASE}))


def routed_queues() -> dict[str, list[str]]:
    """Alias -> the known queues a router's ``db_for_queue`` places there (those that
    ``MYSQLQ['QUEUES']`` doesn't place), in name order: what the system checks judge."""
    conf = get_settings()
    known = {queue for source in _queue_sources for queue in source()}
    groups: dict[str, list[str]] = {}
    for queue in sorted({*conf.QUEUES, *known}):
        entry = conf.QUEUES.get(queue)
        if entry is not None and entry.get("DATABASE"):
            continue
        alias = _routed(queue)
        if alias is not None:
            groups.setdefault(alias, []).append(queue)
    return groups


def read_alias(alias: str | None = None) -> str:
    """Where the read-only views (admin lists, dashboard, ``queuestats``, the pipeline's
    reads) read the queue tables of ``alias`` (None: ``MYSQLQ['DATABASE']``): its replica
    in ``MYSQLQ['READ_DATABASE']``, else the alias itself. Never for a claim, an ack or an
    operator action: those always use the queue's own alias."""
    conf = get_settings()
    alias = alias or conf.DATABASE
    read = conf.READ_DATABASE
    if isinstance(read, str):
        return read if alias == conf.DATABASE else alias
    if read:
        return read.get(alias, alias)
    return alias


def replica_aliases() -> dict[str, str]:
    """Queue alias -> the replica alias its reads go to (only those that have one)."""
    conf = get_settings()
    read = conf.READ_DATABASE
    if isinstance(read, str):
        return {conf.DATABASE: read}
    return dict(read or {})


class QueueRouter:
    """A router to add to ``DATABASE_ROUTERS``: the queue's tables (app ``django_mysqlq``)
    are migrated to, and only to, the aliases that hold queues; other apps are left to
    the other routers. ``manage.py migrate --database queues_b`` then makes them there.
    ORM queries on the queue's models go to this thread's bound alias (the admin binds
    the database a page shows), else ``MYSQLQ['DATABASE']``."""

    def db_for_read(self, model: type, **hints: object) -> str | None:
        return self._queue_alias(model)

    def db_for_write(self, model: type, **hints: object) -> str | None:
        return self._queue_alias(model)

    def _queue_alias(self, model: type) -> str | None:
        if getattr(getattr(model, "_meta", None), "app_label", None) != "django_mysqlq":
            return None
        return bound_alias() or get_settings().DATABASE

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None,
                      **hints: object) -> bool | None:
        if app_label != "django_mysqlq":
            return None
        return db in queue_aliases()
