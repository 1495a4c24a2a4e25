"""The Tasks framework, wherever it lives: ``django.tasks`` (Django >= 6.0) or the
``django-tasks`` backport (module ``django_tasks``, for Django 5.2).

Everything in this package imports the framework from here, so the rest reads the same
on both. Importing this module raises ``ImportError`` when neither is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type-checked against Django 6's own framework
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
else:
    try:
        import django.tasks  # noqa: F401 - only to learn which framework is there
    except ImportError:
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        FRAMEWORK = "django_tasks"
    else:
        from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TaskError
        from django.tasks.exceptions import (
            InvalidTask,
            InvalidTaskBackend,
            TaskResultDoesNotExist,
            TaskResultMismatch,
        )
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

        FRAMEWORK = "django.tasks"

__all__ = [
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
