"""What runs on Spark's Python executors: a minimal Django (so the broker imports) and a
plain ``MySQLdb`` connection to write with.

Executors are separate processes, maybe on other machines, without the site's settings:
they get the connection arguments from the driver (:class:`.database.Database`) and
configure only this app, never the site's settings module.
"""

from __future__ import annotations

from typing import Any


def setup_django() -> None:
    """Make ``django_mysqlq.broker`` importable in this process (once)."""
    import django
    from django.apps import apps
    from django.conf import settings

    if apps.ready:
        return
    if not settings.configured:
        settings.configure(INSTALLED_APPS=["django_mysqlq"], USE_TZ=True, DATABASES={})
    django.setup()


def connect(connect_args: dict[str, Any]) -> Any:
    """A new connection for one partition's writes (the caller closes it)."""
    import MySQLdb

    return MySQLdb.connect(**connect_args)
