"""Wiring done when the app is ready; imports no Tasks framework unless ``TASKS`` uses
this backend."""

from __future__ import annotations

import importlib
from typing import Any

from ..exceptions import UnknownTask
from ..registry import registry
from ..tasks import QueueTask
from . import checks
from .wire import DJANGO_TASK_PREFIX


def resolve(name: str) -> QueueTask[Any, Any]:
    """The registry's resolver for ``django.tasks:`` names (the framework loads lazily)."""
    try:
        from .running import resolve as resolve_with_framework
    except ImportError as exc:
        raise UnknownTask(
            f"{name!r} is a Django task, but this worker can't load a Tasks framework "
            f"({exc}); Django 6 has one, on Django 5.2 install django-tasks.") from exc
    return resolve_with_framework(name)


def ready() -> None:
    registry.add_resolver(DJANGO_TASK_PREFIX, resolve)
    if checks.uses_this_backend():
        # Django registers its check of TASKS backends when the framework is imported;
        # import it now, so the backend's checks run in `check` and at worker start.
        for module in ("django.tasks.checks", "django_tasks.checks"):
            try:
                importlib.import_module(module)
            except ImportError:
                continue
            break
