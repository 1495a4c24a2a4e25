"""A backend for Django's Tasks framework (``django.tasks``, or the ``django-tasks``
backport on Django 5.2)::

    TASKS = {"default": {"BACKEND": "django_mysqlq.backend.MySQLQueueBackend"}}

The names below load on first use, so that importing the package (the app does, to run
Django tasks from the worker) needs no Tasks framework.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import MySQLQueueBackend, MySQLQueueTask
    from .results import TaskCancelled, WorkerLost

__all__ = ["MySQLQueueBackend", "MySQLQueueTask", "TaskCancelled", "WorkerLost"]

_HOMES = {"MySQLQueueBackend": ".core", "MySQLQueueTask": ".core",
          "TaskCancelled": ".results", "WorkerLost": ".results"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
