"""Finding the Django task a message names, without running code nobody vouched for.

The rule ("only registered tasks run"): a message name ``django.tasks:<module>.<name>`` is
run only when ``<module>.<name>`` is a Django ``Task`` whose own ``module_path`` is that
path, bound to a ``MySQLQueueBackend`` alias. To find it:

* a module is **imported only if it is a task module**: the ``tasks`` module of an
  installed app, or one listed in ``MYSQLQ['TASK_MODULES']`` (what a worker imports at
  start anyway). Any other module must already be imported by the process; a path such
  as ``some.module.func`` taken from the table never makes Python import ``some.module``;
* attributes are read with ``inspect.getattr_static``, so no descriptor or module
  ``__getattr__`` runs during the look-up;
* the object found is never called unless it passed every check above.

Which backend runs it is the alias the message was enqueued with, so a task declared
for another backend and sent here with ``.using(backend=...)`` runs too (see
``queue_alias``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from types import ModuleType
from typing import Any

from django.apps import apps

from ..conf import get_settings
from ..exceptions import UnknownTask
from .compat import InvalidTaskBackend, Task, task_backends
from .kind import RunsOnThisQueue


def task_modules() -> frozenset[str]:
    """The modules a worker imports at start: may be imported to find a task."""
    names = {f"{config.name}.tasks" for config in apps.get_app_configs()}
    names.update(get_settings().TASK_MODULES)
    return frozenset(names)


def _module(name: str, allowed: frozenset[str]) -> ModuleType | None:
    module = sys.modules.get(name)
    if module is None and name in allowed:
        try:
            module = importlib.import_module(name)
        except ImportError:
            return None
    return module


def find_object(module_path: str) -> object | None:
    """The object at ``module_path``, or None, under the import rule above."""
    parts = module_path.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        return None
    allowed = task_modules()
    for cut in range(len(parts) - 1, 0, -1):
        module = _module(".".join(parts[:cut]), allowed)
        if module is None:
            continue
        found: Any = module
        for attribute in parts[cut:]:
            try:
                found = inspect.getattr_static(found, attribute)
            except AttributeError:
                return None
        return found  # type: ignore[no-any-return]
    return None


def find_task(module_path: str) -> Task[..., Any]:
    """The Django task whose own path is ``module_path``; else ``UnknownTask``."""
    found = find_object(module_path)
    if not isinstance(found, Task):
        raise UnknownTask(
            f"No Django task is found at {module_path!r} in this process. Only @task "
            "objects of an already imported module, an installed app's tasks.py or a module "
            "in MYSQLQ['TASK_MODULES'] are run; nothing else is imported or called."
        )
    if found.module_path != module_path:
        raise UnknownTask(
            f"{module_path!r} is another name for the task {found.module_path!r}; only a "
            "task's own module path is run."
        )
    return found


def queue_alias(task: Task[..., Any], enqueued_with: str | None) -> str:
    """The ``MySQLQueueBackend`` alias that runs ``task``: the one its message was
    enqueued with, else (a message written without one) the task's own backend.

    Raises ``UnknownTask`` when that alias is not a ``MySQLQueueBackend``: the task is
    not meant to run from this queue.
    """
    alias = enqueued_with if enqueued_with is not None else task.backend
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend as exc:
        raise UnknownTask(f"The task {task.module_path!r} names the backend {alias!r}, "
                          f"which is not configured in TASKS: {exc}") from exc
    if not isinstance(backend, RunsOnThisQueue):
        raise UnknownTask(
            f"The task {task.module_path!r} was enqueued for the backend {alias!r} "
            f"({type(backend).__name__}), not a MySQLQueueBackend: it is not run from this "
            "queue."
        )
    return alias
