"""Will a worker find this Django task? Asked at enqueue, so that a task whose module no
worker imports raises there, with the fix, instead of its messages going dead later.

A worker imports the installed apps' ``tasks`` modules and ``MYSQLQ['TASK_MODULES']``
(see ``lookup``), and ``django.setup()`` imports every app's ``models``. A task defined
in one of those is found; so is a task that one of them imports (``from .jobs import
send``, or ``from . import jobs``). Anything else is refused, even if some other import
(an ``AppConfig.ready()``) would happen to load it on the worker: naming the module in
``TASK_MODULES`` costs nothing and makes the contract explicit.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

from django.apps import apps
from django.core.signals import setting_changed
from django.dispatch import receiver

from .compat import InvalidTask, Task
from .lookup import find_object, task_modules

#: Module paths of tasks already found reachable (the check then costs a set look-up).
_reachable: set[str] = set()


def check_reachable(task: Task[..., Any]) -> None:
    """Raise ``InvalidTask`` unless a worker will import the task's module."""
    path = task.module_path
    if path in _reachable:
        return
    module = task.func.__module__
    imported = task_modules() | {f"{config.name}.models" for config in apps.get_app_configs()}
    if module in imported or _imported_by(task, module, imported):
        _at_its_own_path(task)
        _reachable.add(path)
        return
    raise InvalidTask(
        f"The task {path!r} is defined in the module {module!r}, which workers never "
        "import: it is not an installed app's tasks module, not in MYSQLQ['TASK_MODULES'], "
        "and no such module imports it. Its messages would go dead on the worker as an "
        f"unknown task. Add {module!r} to MYSQLQ['TASK_MODULES'], or move the task into "
        "an app's tasks.py."
    )


def _at_its_own_path(task: Task[..., Any]) -> None:
    """A worker finds a task at its function's own path (module and qualified name): one
    bound to another name (``send = task(_send)``) is not found there, and its messages
    would go dead as unknown tasks (immediate mode ran them: tests passed)."""
    found = find_object(task.module_path)
    if isinstance(found, Task) and found.func is task.func:
        return
    raise InvalidTask(
        f"The task of {task.module_path!r} is not at that path: a worker looks a task up "
        f"by its function's module and name, and finds {type(found).__name__} there. "
        "Decorate the function itself with @task (not name = task(function) under another "
        "name).")


def _imported_by(task: Task[..., Any], module: str, candidates: frozenset[str] | set[str]
                 ) -> bool:
    """Whether a module the worker imports holds the task, or its module, as a name."""
    for name in sorted(candidates):
        loaded = _load(name)
        if loaded is None:
            continue
        for value in vars(loaded).values():
            if isinstance(value, Task) and value.func is task.func:
                return True
            if isinstance(value, ModuleType) and value.__name__ == module:
                return True
    return False


def _load(name: str) -> ModuleType | None:
    """The module, imported as a worker would; None if it doesn't exist or fails (the
    system check ``django_mysqlq.E005`` reports a failing one)."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - E005 tells; here it only can't vouch for the task
        return None


@receiver(setting_changed)
def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting in ("MYSQLQ", "INSTALLED_APPS"):
        _reachable.clear()
