"""The worker's side: running a Django task's message like any other.

``resolve_task`` is the registry's resolver for ``django.tasks:`` names (see ``lookup``
for which objects may run, and under which backend alias). The ``QueueTask`` it returns
carries ``DjangoTaskHooks`` (see ``attempts``), so the executor claims, retries, records
and recovers the message exactly as for ``@queue_task``, while each attempt gets
Django's part.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import UnknownTask
from ..tasks import QueueTask
from . import wire
from .attempts import DjangoAttempt, DjangoTaskHooks
from .core import MySQLQueueBackend
from .lookup import find_task
from .options import BackendOptions

__all__ = ["DjangoAttempt", "DjangoTaskHooks", "resolve", "resolve_task"]


def resolve_task(name: str) -> QueueTask[Any, Any]:
    """The runnable task for a ``django.tasks:`` message name, or ``UnknownTask``."""
    task = find_task(wire.module_path_of(name))
    # The message row holds the attempts, backoff and timeout it was enqueued with;
    # these copies only describe the task to this queue's own signals.
    backend = task.get_backend()
    options = backend.queue_options if isinstance(backend, MySQLQueueBackend) \
        else BackendOptions()
    max_attempts, retry_backoff, timeout = options.resolved(task)
    return QueueTask(func=task.func, name=name, queue=task.queue_name,
                     priority=int(task.priority), max_attempts=max_attempts,
                     retry_backoff=retry_backoff, timeout=timeout,
                     hooks=DjangoTaskHooks(task))


def resolve(name: str) -> QueueTask[Any, Any]:
    """``resolve_task``, with any unexpected failure reported as ``UnknownTask`` (the
    message then goes dead with the reason instead of troubling the worker)."""
    try:
        return resolve_task(name)
    except UnknownTask:
        raise
    except Exception as exc:
        raise UnknownTask(f"Could not resolve the Django task {name!r}: "
                          f"{type(exc).__name__}: {exc}") from exc


