"""System checks of ``MySQLQueueBackend`` (``django_mysqlq.E1xx`` / ``W1xx``).

``check_backend`` runs through Django's own check of every ``TASKS`` backend.
``check_framework`` is registered by this app, for the one problem Django can't report:
``TASKS`` names this backend but no Tasks framework is installed. Importing this module
needs no Tasks framework.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from ..checks import NOT_MYSQL_HINT, queue_vendor
from ..conf import SettingsError, load_settings
from .options import VALIDATORS, BackendOptions, queue_problem

if TYPE_CHECKING:
    from .core import MySQLQueueBackend

BACKEND_PATH = "django_mysqlq.backend.MySQLQueueBackend"
_DOCS = "See docs/django-tasks.md."


def check_backend(backend: MySQLQueueBackend) -> list[CheckMessage]:
    where = f"TASKS[{backend.alias!r}]"
    messages: list[CheckMessage] = []
    messages.extend(_queue_messages(where, backend.params.get("QUEUES"), backend.queues))
    messages.extend(_placement_messages(where, backend.queues))
    messages.extend(_option_messages(where, backend.queue_options))
    messages.extend(_database_messages(where))
    if not apps.is_installed("django_mysqlq"):
        messages.append(Error(
            f"{where} uses MySQLQueueBackend, but 'django_mysqlq' is not in INSTALLED_APPS.",
            hint="Add 'django_mysqlq' to INSTALLED_APPS and migrate: it owns the queue "
                 "tables and the runqueueworker command.", id="django_mysqlq.E105"))
    return messages


def _placement_messages(where: str, queues: set[str]) -> list[CheckMessage]:
    """The backend's queues live on ``MYSQLQ['DATABASE']``: its result reads, the
    ``task_enqueued`` hook and a worker's reading of earlier attempts go there (placed on
    another database, ``get_result`` found no result, or another message's)."""
    from ..routing import alias_for_queue

    try:
        main = load_settings().DATABASE
    except SettingsError:
        return []  # E001 reports it
    return [Error(f"{where}['QUEUES'] holds {queue!r}, which MYSQLQ['QUEUES'] or a router "
                  f"places on {alias_for_queue(queue)!r}; a Django task's queue must live "
                  f"on MYSQLQ['DATABASE'] ({main!r}).",
                  hint="Keep Django tasks' queues on MYSQLQ['DATABASE'] (use @queue_task "
                       "for tasks on another database; see docs/scaling.md).",
                  id="django_mysqlq.E107")
            for queue in sorted(q for q in queues if isinstance(q, str))
            if alias_for_queue(queue) != main]


def _queue_messages(where: str, raw: object, queues: set[str]) -> list[CheckMessage]:
    if raw is not None and (isinstance(raw, str) or not isinstance(raw, Sequence | set)):
        return [Error(f"{where}['QUEUES'] must be a list of queue names, not {raw!r}.",
                      hint="For example \"QUEUES\": [\"default\"].", id="django_mysqlq.E101")]
    messages: list[CheckMessage] = []
    for queue in sorted(queues, key=repr):
        problem = queue_problem(queue)
        if problem:
            messages.append(Error(f"{where}['QUEUES'] holds {queue!r}. {problem}",
                                  hint="Rename the queue.", id="django_mysqlq.E101"))
    if not queues:
        messages.append(Warning(
            f"{where}['QUEUES'] is empty, so tasks may name any queue.",
            hint="List the queues your workers serve (runqueueworker --queues): a task "
                 "whose queue_name has a typo then fails at import instead of waiting in a "
                 "queue no worker serves.", id="django_mysqlq.W101"))
    return messages


def _option_messages(where: str, options: BackendOptions) -> list[CheckMessage]:
    messages: list[CheckMessage] = [
        Error(f"{where}['OPTIONS']: {problem}", hint=_DOCS, id="django_mysqlq.E102")
        for problem in options.problems
    ]
    known = ", ".join(VALIDATORS)
    messages.extend(
        Error(f"{where}['OPTIONS'] has the unknown option {key!r}.",
              hint=f"Known options: {known}.", id="django_mysqlq.E103")
        for key in options.unknown
    )
    return messages


def _database_messages(where: str) -> list[CheckMessage]:
    try:
        conf = load_settings()
    except SettingsError:
        return []  # django_mysqlq.E001 reports it
    alias = conf.DATABASE
    if alias not in settings.DATABASES:
        return [Error(f"{where} stores tasks in MYSQLQ['DATABASE'] = {alias!r}, which is "
                      "not in DATABASES.", hint=f"Use one of: {', '.join(settings.DATABASES)}.",
                      id="django_mysqlq.E104")]
    vendor = queue_vendor(alias)
    if vendor != "mysql" and not conf.IMMEDIATE:  # the test mode stores nothing
        engine = settings.DATABASES[alias].get("ENGINE", "")
        return [Error(f"{where} stores tasks in the database {alias!r}, which uses "
                      f"{engine!r} ({vendor}), not MySQL or MariaDB.",
                      hint="Point MYSQLQ['DATABASE'] at a MySQL/MariaDB alias. "
                           + NOT_MYSQL_HINT.split(". ", 1)[1],
                      id="django_mysqlq.E104")]
    return []


def uses_this_backend() -> bool:
    """Whether ``TASKS`` names ``MySQLQueueBackend`` for any alias."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, Mapping):
        return False
    return any(isinstance(params, Mapping) and params.get("BACKEND") == BACKEND_PATH
               for params in configured.values())


@register()
def check_framework(app_configs: Sequence[AppConfig] | None = None,
                    **kwargs: Any) -> list[CheckMessage]:
    if not uses_this_backend():
        return []
    try:
        from . import compat  # noqa: F401
    except ImportError:
        return [Error(
            "TASKS uses MySQLQueueBackend, but no Tasks framework is installed.",
            hint="Django 6 has one (django.tasks); on Django 5.2 install the backport: "
                 "pip install 'django-mysqlq[django52]'.", id="django_mysqlq.E106")]
    return []
