"""The queues Django's tasks on this backend use, for a worker given no ``--queues``.

Django tasks are resolved by name when a message arrives, not registered, so a worker
learns their queues from the settings and the task modules it imported: the ``QUEUES`` of
every ``TASKS`` alias whose backend is a ``MySQLQueueBackend``, and the ``queue_name`` of
every ``Task`` bound to such an alias in a task module (an installed app's ``tasks``, or
``MYSQLQ['TASK_MODULES']``). Imports no Tasks framework unless ``TASKS`` is set.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from django.conf import settings


def declared_queues() -> set[str]:
    """Queues this backend's aliases list, and those their imported tasks name."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, Mapping) or not configured:
        return set()
    try:
        from .compat import Task, task_backends
        from .core import MySQLQueueBackend
    except ImportError:  # no Tasks framework: the system check says so
        return set()
    from .lookup import task_modules

    found: set[str] = set()
    aliases = set()
    for alias in configured:
        try:
            backend = task_backends[alias]
        except Exception:  # noqa: BLE001 - a broken alias is the system checks' to report
            continue
        if isinstance(backend, MySQLQueueBackend):
            aliases.add(alias)
            found.update(str(queue) for queue in backend.queues)
    for name in task_modules():
        module = sys.modules.get(name)
        if module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Task) and value.backend in aliases:
                found.add(str(value.queue_name))
    return found
