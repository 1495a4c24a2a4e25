"""System checks: settings (E001-E004, W002) and the live server (W001)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.utils import load_backend

from .conf import SettingsError, load_settings


@register()
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
        engine = str(settings.DATABASES[conf.DATABASE].get("ENGINE", ""))
        try:  # by vendor, so MySQL wrappers and subclassed backends pass
            vendor = load_backend(engine).DatabaseWrapper.vendor
        except ImproperlyConfigured:
            vendor = "unknown"
        if vendor != "mysql":
            errors.append(Error(
                f"The queue database {conf.DATABASE!r} uses {engine!r} ({vendor}).",
                hint="django-mysqlq needs MySQL or MariaDB (ENGINE "
                     "'django.db.backends.mysql').", id="django_mysqlq.E003"))
    if not settings.USE_TZ:
        errors.append(Error(
            "USE_TZ is False.",
            hint="django-mysqlq keeps every time in UTC on the database clock; set USE_TZ = True.",
            id="django_mysqlq.E004"))
    return errors


@register(Tags.database)
def check_binlog_format(app_configs: Sequence[AppConfig] | None = None,
                        databases: Sequence[str] | None = None,
                        **kwargs: Any) -> list[CheckMessage]:
    """``UPDATE … LIMIT`` is unsafe for statement-based replication."""
    try:
        alias = load_settings().DATABASE
    except SettingsError:
        return []
    if not databases or alias not in databases or alias not in settings.DATABASES:
        return []
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT @@GLOBAL.binlog_format")
            row = cursor.fetchone()
    except DatabaseError:
        return []
    if row and str(row[0]).upper() == "STATEMENT":
        return [Warning(
            "binlog_format is STATEMENT: the queue's UPDATE … LIMIT claims replicate unsafely.",
            hint="Set binlog_format to ROW or MIXED on the server.", id="django_mysqlq.W001")]
    return []


@register()
def check_isolation_level(app_configs: Sequence[AppConfig] | None = None,
                          **kwargs: Any) -> list[CheckMessage]:
    """The queue database should run at READ COMMITTED, Django's MySQL default."""
    try:
        alias = load_settings().DATABASE
    except SettingsError:
        return []
    database: dict[str, Any] = settings.DATABASES.get(alias, {})
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
