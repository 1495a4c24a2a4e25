"""What the operator commands say of a name given to them that nothing uses.

A queue no message, history row, live worker, known task, ``MYSQLQ['QUEUES']`` entry or
pause uses is likely a typo (``queuepause emial``), as a worker warns at start of such a
queue. A ``--task`` with no message may be a Django ``@task`` given by its function's path:
its messages are stored as ``django.tasks:<path>``. The commands still do what they were
told (pausing a queue ahead of time is legitimate): these are warnings, on stderr.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import ImproperlyConfigured

from .. import broker
from ..backend.wire import DJANGO_TASK_PREFIX
from ..conf import get_settings
from ..registry import import_task_modules, registry
from ..routing import alias_for_queue


def queue_unused(queue: str) -> bool:
    """Nothing uses ``queue``: no task this process knows (nor the default queue or a
    Django backend's), no ``MYSQLQ['QUEUES']`` entry, and on its database no message,
    history row, live worker serving it or pause."""
    from ..worker.queues import placed_queues

    if queue in placed_queues() or queue in get_settings().QUEUES:
        return False
    alias = alias_for_queue(queue)
    return not (queue in broker.served_queues(alias) or queue in broker.paused_queues(alias)
                or broker.queue_has_rows(queue, alias))


def queue_warning(queue: str, then: str = "") -> str | None:
    """``no message, worker or task uses queue 'emial': a typo?`` (and ``then``), or None."""
    if not queue_unused(queue):
        return None
    return f"no message, worker or task uses queue {queue!r}: a typo?" + \
        (f" {then}" if then else "")


def _django_task_known(module_path: str) -> bool:
    """A Django ``@task`` of this backend is found at ``module_path`` (its module imported
    only if it is a task module, as a worker finds it)."""
    try:
        from ..backend.lookup import find_task
    except ImportError:  # no Tasks framework
        return False
    try:
        find_task(module_path)
    except Exception:  # noqa: BLE001 - an unknown task, or a module that fails: not found
        return False
    return True


def _registered(task_name: str) -> bool:
    try:
        import_task_modules()
    except ImproperlyConfigured:
        pass  # E005: judge by the tasks that did import
    return task_name in registry.names()


def task_warning(task_name: str) -> str | None:
    """What to say of ``--task task_name`` when no message (waiting, running or dead) on
    the database in use is of it; None when some is. Names the ``django.tasks:`` name when
    that one has messages or is a Django task."""
    if broker.task_has_messages(task_name):
        return None
    said = f"no message of task {task_name!r}"
    path = task_name.removeprefix(DJANGO_TASK_PREFIX)
    if path == task_name:
        stored = DJANGO_TASK_PREFIX + task_name
        if broker.task_has_messages(stored) or _django_task_known(task_name):
            return (f"{said}; did you mean {stored}? (Django @task messages are stored "
                    "under that name)")
    elif _django_task_known(path):
        return f"{said}."  # a Django @task by its stored name: right, just no message now
    if _registered(task_name) or broker.task_has_history(task_name):
        return f"{said}."
    return f"{said}: a typo?"


def filter_warnings(queues: Sequence[str], tasks: Sequence[str]) -> list[str]:
    """The warnings for a command's ``--queue`` and ``--task`` filters."""
    return [*(said for queue in queues if (said := queue_warning(queue)) is not None),
            *(said for task in tasks if (said := task_warning(task)) is not None)]
