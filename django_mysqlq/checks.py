"""System checks: settings (E001-E006, W002, W003), group queues (E007), queue databases
(E010-E013) and the live server (W001)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router
from django.db.utils import load_backend

from . import routing
from .conf import QueueSettings, SettingsError, load_settings
from .topicnames import GROUP_QUEUE_PREFIX

#: The tag of the checks the operator commands (``queuestats``, ``queuepause``, …) run:
#: the settings and where the queues live (E001-E004, E010-E013), without which no
#: command can work. Not the task code's (E005-E007): an operator must be able to pause,
#: inspect and requeue while a task module or a schedule is broken.
SETTINGS_TAG = "mysqlq_settings"


def queue_vendor(alias: str) -> str:
    """The vendor of the database ``alias`` (by backend, so MySQL wrappers count as mysql)."""
    engine = str(settings.DATABASES[alias].get("ENGINE", ""))
    try:
        return str(load_backend(engine).DatabaseWrapper.vendor)
    except ImproperlyConfigured:
        return "unknown"


#: What to do about a queue database that isn't MySQL (E003 and E104 say it).
NOT_MYSQL_HINT = (
    "django-mysqlq needs MySQL or MariaDB (ENGINE 'django.db.backends.mysql'). To run your "
    "tests on another database, turn the test mode on in the test settings: "
    "MYSQLQ = {'IMMEDIATE': True} runs each enqueued task in-process after the commit "
    "(see docs/testing.md)."
)


@register(SETTINGS_TAG)
def check_settings(app_configs: Sequence[AppConfig] | None = None,
                   **kwargs: Any) -> list[CheckMessage]:
    try:
        conf = load_settings()
    except SettingsError as exc:
        return [
            Error(problem, hint="Fix the MYSQLQ setting; docs/settings.md lists every key.",
                  id="django_mysqlq.E001")
            for problem in exc.problems
        ]
    errors: list[CheckMessage] = []
    if conf.DATABASE not in settings.DATABASES:
        errors.append(Error(
            f"MYSQLQ['DATABASE'] is {conf.DATABASE!r}, which is not in DATABASES.",
            hint=f"Use one of: {', '.join(settings.DATABASES)}.", id="django_mysqlq.E002"))
    else:
        vendor = queue_vendor(conf.DATABASE)
        # The test mode touches no queue table: any database will do.
        if vendor != "mysql" and not conf.IMMEDIATE:
            engine = settings.DATABASES[conf.DATABASE].get("ENGINE", "")
            errors.append(Error(
                f"The queue database {conf.DATABASE!r} uses {engine!r} ({vendor}).",
                hint=NOT_MYSQL_HINT, id="django_mysqlq.E003"))
    if not settings.USE_TZ:
        errors.append(Error(
            "USE_TZ is False.",
            hint="django-mysqlq keeps every time in UTC on the database clock; set USE_TZ = True.",
            id="django_mysqlq.E004"))
    return errors


@register(SETTINGS_TAG)
def check_queue_databases(app_configs: Sequence[AppConfig] | None = None,
                          **kwargs: Any) -> list[CheckMessage]:
    """Every alias a queue names (``MYSQLQ['QUEUES']``, ``READ_DATABASE``, a router's
    ``db_for_queue``) exists and is MySQL or MariaDB (E010, E011, E013), and
    ``READ_DATABASE``'s keys hold queues (E011)."""
    try:
        conf = load_settings()
    except SettingsError:
        return []  # E001 reports it
    errors: list[CheckMessage] = []
    named = [(f"MYSQLQ['QUEUES'][{queue!r}]['DATABASE']", str(entry["DATABASE"]), "E010")
             for queue, entry in conf.QUEUES.items() if entry.get("DATABASE")]
    for alias, read in _read_aliases(conf.READ_DATABASE, conf.DATABASE).items():
        named.append((f"MYSQLQ['READ_DATABASE'] (for {alias!r})", read, "E011"))
    errors.extend(_stray_read_keys(conf.READ_DATABASE))
    errors.extend(_routed_elsewhere(conf))
    for where, alias, code in named:
        if alias not in settings.DATABASES:
            errors.append(Error(
                f"{where} is {alias!r}, which is not in DATABASES.",
                hint=f"Use one of: {', '.join(settings.DATABASES)}.",
                id=f"django_mysqlq.{code}"))
        elif queue_vendor(alias) != "mysql" and not conf.IMMEDIATE:
            errors.append(Error(f"{where} is {alias!r}, which is not MySQL or MariaDB.",
                                hint=NOT_MYSQL_HINT, id=f"django_mysqlq.{code}"))
    for queue, entry in conf.QUEUES.items():
        if queue.startswith(GROUP_QUEUE_PREFIX) and entry.get("DATABASE") \
                and str(entry["DATABASE"]) != conf.DATABASE:
            errors.append(Error(
                f"The consumer group queue {queue!r} is placed on {entry['DATABASE']!r}; "
                f"topics and their groups' queues live on MYSQLQ['DATABASE'] "
                f"({conf.DATABASE!r}) only.",
                hint="Remove its 'DATABASE' (topics on several databases are not supported; "
                     "see docs/scaling.md).", id="django_mysqlq.E012"))
    return errors


def _routed_elsewhere(conf: QueueSettings) -> list[CheckMessage]:
    """Queues a router's ``db_for_queue`` places on an alias missing from ``DATABASES``,
    or on one that is not MySQL (E013): their enqueues and workers would fail there."""
    errors: list[CheckMessage] = []
    for alias, queues in routing.routed_queues().items():
        where = (f"A database router's db_for_queue places the queue(s) "
                 f"{', '.join(map(repr, queues))} on {alias!r}")
        if alias not in settings.DATABASES:
            errors.append(Error(
                f"{where}, which is not in DATABASES.",
                hint=f"Make db_for_queue return one of: {', '.join(settings.DATABASES)} (or "
                     "None to leave the queue on MYSQLQ['DATABASE']), or add the alias to "
                     "DATABASES.", id="django_mysqlq.E013"))
        elif queue_vendor(alias) != "mysql" and not conf.IMMEDIATE:
            errors.append(Error(f"{where}, which is not MySQL or MariaDB.",
                                hint=NOT_MYSQL_HINT, id="django_mysqlq.E013"))
    return errors


def _stray_read_keys(read: object) -> list[CheckMessage]:
    """A ``READ_DATABASE`` dict's keys that hold no queues (a typo: their reads would go to
    the primary, silently). A key a ``db_for_queue`` router may answer passes if it is an
    alias of ``DATABASES`` (the router's queues are not known in advance)."""
    if not isinstance(read, dict):
        return []
    aliases = routing.queue_aliases()
    routed = any(hasattr(each, "db_for_queue") for each in router.routers)
    return [Error(
        f"MYSQLQ['READ_DATABASE'] has the key {key!r}, which is not an alias that holds "
        "queues: the queues it was meant for are read on their primary.",
        hint=f"Key it by a queue database alias: {', '.join(aliases)} "
             "(MYSQLQ['DATABASE'] and those of MYSQLQ['QUEUES']).",
        id="django_mysqlq.E011")
        for key in read if str(key) not in aliases
        and not (routed and str(key) in settings.DATABASES)]


def _read_aliases(read: object, default: str) -> dict[str, str]:
    if isinstance(read, str):
        return {default: read}
    if isinstance(read, dict):
        return {str(alias): str(replica) for alias, replica in read.items()}
    return {}


@register(Tags.database)
def check_binlog_format(app_configs: Sequence[AppConfig] | None = None,
                        databases: Sequence[str] | None = None,
                        **kwargs: Any) -> list[CheckMessage]:
    """``UPDATE … LIMIT`` is unsafe for statement-based replication (on every database
    that holds queues)."""
    found: list[CheckMessage] = []
    for alias in _queue_databases():
        if not databases or alias not in databases or alias not in settings.DATABASES:
            continue
        if queue_vendor(alias) != "mysql":
            continue  # a statement error could abort a PostgreSQL transaction
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT @@GLOBAL.binlog_format")
                row = cursor.fetchone()
        except DatabaseError:
            continue
        if row and str(row[0]).upper() == "STATEMENT":
            found.append(Warning(
                f"binlog_format is STATEMENT on the server of queue database {alias!r}: the "
                "queue's UPDATE … LIMIT claims replicate unsafely.",
                hint="Set binlog_format to ROW or MIXED on the server.",
                id="django_mysqlq.W001"))
    return found


def _queue_databases() -> list[str]:
    """The aliases that hold queues (``MYSQLQ['DATABASE']`` first); none when the
    settings are wrong (their own checks say so)."""
    from . import routing

    try:
        load_settings()
        return list(routing.queue_aliases())
    except (SettingsError, ImproperlyConfigured):
        return []


@register()
def check_isolation_level(app_configs: Sequence[AppConfig] | None = None,
                          **kwargs: Any) -> list[CheckMessage]:
    """Every queue database should run at READ COMMITTED, Django's MySQL default."""
    return [warning for alias in _queue_databases()
            for warning in _isolation_warning(alias)]


def _isolation_warning(alias: str) -> list[CheckMessage]:
    database: dict[str, Any] = settings.DATABASES.get(alias, {})
    if not database or queue_vendor(alias) != "mysql":
        return []  # another vendor's isolation_level means something else
    options: dict[str, Any] = database.get("OPTIONS") or {}
    level = options.get("isolation_level", "read committed")
    if isinstance(level, str) and level.lower() == "read committed":
        return []
    shown = repr(level) if level else "None (the server's default, often REPEATABLE READ)"
    return [Warning(
        f"The queue database {alias!r} has OPTIONS['isolation_level'] = {shown}, not "
        "'read committed'.",
        hint="The worker's own connections (claim, ack, recovery) switch to READ COMMITTED "
             "and the broker's short transactions on task connections use it for that "
             "transaction only, but enqueue() runs at your level inside your transactions, "
             "and tasks see your level. Remove the option (Django's default is 'read "
             "committed') unless your own code needs another level; see docs/install.md.",
        id="django_mysqlq.W002")]


@register()
def check_task_modules(app_configs: Sequence[AppConfig] | None = None,
                       **kwargs: Any) -> list[CheckMessage]:
    """Every module a worker imports at start must import: else it stops with a traceback.

    ``MYSQLQ['TASK_MODULES']`` entries are looked up first (a typo names no module), then
    imported to surface errors inside them; so are the installed apps' ``tasks`` modules
    that exist. Importing is what a worker does anyway, and Python imports a module once.
    """
    try:
        conf = load_settings()
    except SettingsError:
        return []  # E001 reports it
    errors: list[CheckMessage] = []
    for module, why in _task_modules(conf):
        problem = _import_problem(module)
        if problem is not None:
            errors.append(Error(
                f"{why} {module!r}, which can't be imported: {problem}",
                hint="Fix the dotted module path (a module such as 'billing.jobs', not a "
                     "file path or a function) or the error inside the module: workers "
                     "import it at start and refuse to start until it imports.",
                id="django_mysqlq.E005"))
    return errors


def _task_modules(conf: QueueSettings) -> list[tuple[str, str]]:
    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    found = [(f"{config.name}.tasks", f"The app {config.label!r} has a tasks module")
             for config in apps.get_app_configs()
             if module_has_submodule(config.module, "tasks")]
    found.extend((module, "MYSQLQ['TASK_MODULES'] lists") for module in conf.TASK_MODULES)
    return found


def _import_problem(module: str) -> str | None:
    """Why ``module`` can't be imported, or None."""
    try:
        if importlib.util.find_spec(module) is None:
            return f"no module named {module!r} exists."
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any error inside the module is the answer
        return f"{type(exc).__name__}: {exc}"
    return None


@register(deploy=True)
def check_immediate_in_production(app_configs: Sequence[AppConfig] | None = None,
                                  **kwargs: Any) -> list[CheckMessage]:
    """The test mode runs tasks inside web requests: never what a deployment wants."""
    try:
        conf = load_settings()
    except SettingsError:
        return []
    if not conf.IMMEDIATE:
        return []
    return [Warning(
        "MYSQLQ['IMMEDIATE'] is True: every enqueued task runs inside the process that "
        "enqueued it (a web request), once, without retries, and no worker sees it.",
        hint="Set IMMEDIATE only in the settings your tests use.", id="django_mysqlq.W003")]


@register()
def check_schedules(app_configs: Sequence[AppConfig] | None = None,
                    **kwargs: Any) -> list[CheckMessage]:
    """Each ``MYSQLQ['SCHEDULES']`` entry names a registered task its arguments fit.

    The task modules are imported first, as a worker does; if one can't be, E005 says so
    and this check waits for it.
    """
    try:
        load_settings()
    except SettingsError:
        return []
    from . import recurring
    from .registry import import_task_modules

    try:
        import_task_modules()
    except ImproperlyConfigured:
        return []
    return [Error(problem, hint="Fix MYSQLQ['SCHEDULES'] (docs/schedules.md): workers write "
                                "every declared schedule when they start and refuse to "
                                "start on one they can't write.", id="django_mysqlq.E006")
            for problem in recurring.problems()]


@register()
def check_group_queues(app_configs: Sequence[AppConfig] | None = None,
                       **kwargs: Any) -> list[CheckMessage]:
    """Queues named ``group:<name>`` hold consumer groups' deliveries: a task of its own
    there would be claimed by the group's members, and counted in its lag (E007)."""
    try:
        load_settings()
    except SettingsError:
        return []
    from .registry import import_task_modules, registry
    from .topicnames import GROUP_QUEUE_PREFIX, TASK_PREFIX

    try:
        import_task_modules()
    except ImproperlyConfigured:
        return []  # E005 says why
    errors: list[CheckMessage] = []
    for name in registry.names():
        task = registry.get(name)
        if task.queue.startswith(GROUP_QUEUE_PREFIX) and not name.startswith(TASK_PREFIX):
            errors.append(Error(
                f"Task {name!r} uses the queue {task.queue!r}, a name kept for the "
                "deliveries of a topic's consumer group.",
                hint="Give the task another queue: names starting with 'group:' belong to "
                     "Topic(...).subscribe(group=...) (docs/streams.md).",
                id="django_mysqlq.E007"))
    return errors
