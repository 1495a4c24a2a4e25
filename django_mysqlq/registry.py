"""The registry workers run tasks from: task name -> task, and the modules that fill it."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from .conf import get_settings
from .exceptions import TaskAlreadyRegistered, UnknownTask

if TYPE_CHECKING:
    from .tasks import QueueTask


#: Finds the task for a name under its prefix, or raises :class:`UnknownTask`.
TaskResolver = Callable[[str], "QueueTask[Any, Any]"]


class TaskRegistry:
    """Task name -> task. A worker runs only what is registered here, or what a resolver
    added for a name prefix vouches for (Django's ``@task`` functions)."""

    def __init__(self) -> None:
        self._tasks: dict[str, QueueTask[Any, Any]] = {}
        self._resolvers: dict[str, TaskResolver] = {}
        self._lock = threading.Lock()

    def add_resolver(self, prefix: str, resolver: TaskResolver) -> None:
        """Let ``resolver`` answer for unregistered names starting with ``prefix``."""
        if not prefix:
            raise ValueError("A resolver needs a non-empty name prefix.")
        with self._lock:
            self._resolvers[prefix] = resolver

    def register(self, task: QueueTask[Any, Any]) -> None:
        with self._lock:
            existing = self._tasks.get(task.name)
            if existing is not None and qualified_name(existing.func) != qualified_name(task.func):
                raise TaskAlreadyRegistered(
                    f"Task name {task.name!r} is already used by "
                    f"{qualified_name(existing.func)}; pass name=... to @queue_task to tell "
                    "them apart."
                )
            self._tasks[task.name] = task

    def get(self, name: str) -> QueueTask[Any, Any]:
        task = self._tasks.get(name)
        if task is not None:
            return task
        for prefix, resolver in list(self._resolvers.items()):
            if name.startswith(prefix):
                return resolver(name)
        raise UnknownTask(
            f"No task named {name!r} is registered in this worker. Check that its "
            "module is an installed app's tasks.py or listed in MYSQLQ['TASK_MODULES']."
        )

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def rate_limited(self) -> bool:
        """Whether a registered task has a rate limit (its worker claims throttled ones)."""
        with self._lock:
            return any(task.rate is not None for task in self._tasks.values())

    def queues(self) -> set[str]:
        """The queues of the registered tasks (a worker's default ``--queues``)."""
        with self._lock:
            return {task.queue for task in self._tasks.values()}


def qualified_name(func: Callable[..., Any]) -> str:
    """``module.qualname``; for a callable without one (a ``functools.partial``, an
    object with ``__call__``), its class's, so messages about it don't crash."""
    if not is_named(func):
        func = type(func)
    return f"{func.__module__}.{func.__qualname__}"


def is_named(func: Callable[..., Any]) -> bool:
    """Whether ``func`` has a ``module.qualname`` of its own (a def, a class, a method)."""
    return (isinstance(getattr(func, "__qualname__", None), str)
            and isinstance(getattr(func, "__module__", None), str))


def unnamed_problem(func: Callable[..., Any], what: str, fix: str) -> str | None:
    """Why ``func`` can't be told apart by ``module.qualname``, or None."""
    if is_named(func):
        return None
    return (f"{what} is named by its function's module.qualname, but {func!r:.80} (a "
            f"{type(func).__name__}) has none: {fix}")


registry = TaskRegistry()


def import_task_modules() -> None:
    """Import every installed app's ``tasks`` module and ``MYSQLQ['TASK_MODULES']``.

    A module that fails raises ``ImproperlyConfigured`` naming it and the error (the
    system check ``django_mysqlq.E005`` reports the same before a worker starts).
    """
    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    for config in apps.get_app_configs():
        if module_has_submodule(config.module, "tasks"):
            _import_task_module(f"{config.name}.tasks", "the tasks module of the app "
                                                        f"{config.label!r}")
    for module in get_settings().TASK_MODULES:
        _import_task_module(module, "MYSQLQ['TASK_MODULES'] lists it")


def _import_task_module(module: str, why: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # any error inside the module stops the worker
        raise ImproperlyConfigured(
            f"Could not import the task module {module!r} ({why}): "
            f"{type(exc).__name__}: {exc}. Fix the module, or the dotted path in "
            "MYSQLQ['TASK_MODULES'] (a module, not a file path or a function)."
        ) from exc
