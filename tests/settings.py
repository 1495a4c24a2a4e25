"""Settings for the test suite and for the worker subprocesses the tests start."""

import hashlib
import os
from pathlib import Path
from typing import Any

_CHECKOUT = str(Path(__file__).resolve().parent.parent)
_TEST_DB = "test_mysqlq_" + hashlib.sha1(_CHECKOUT.encode()).hexdigest()[:8]

SECRET_KEY = "tests-only"
USE_TZ = True
DEBUG = False
# Django 6's default; set so Django 5.2 (CI's second run) builds the same models.
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the live server of the browser test serves admin CSS
    # Above the admin, so its admin/index.html (the queue box) wins.
    "django_mysqlq",
    "django.contrib.admin",
    "tests.testapp",
]
ROOT_URLCONF = "tests.urls"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]
STATIC_URL = "/static/"
DATABASES = {
    "default": {
        # "tests.mysqlpaths": MariaDB spoken to as MySQL (tests/test_mysql_paths.py).
        "ENGINE": os.environ.get("MYSQLQ_TEST_ENGINE", "django.db.backends.mysql"),
        "HOST": os.environ.get("MYSQLQ_TEST_HOST", "127.0.0.1"),
        "PORT": int(os.environ.get("MYSQLQ_TEST_PORT", "3306")),
        "USER": os.environ.get("MYSQLQ_TEST_USER", "root"),
        "PASSWORD": os.environ.get("MYSQLQ_TEST_PASSWORD", ""),
        # Worker subprocesses get the test database's name through this variable.
        "NAME": os.environ.get("MYSQLQ_TEST_DB", "mysqlq"),
        # MYSQLQ_TEST_ISOLATION="repeatable read" runs a process (a worker) at that level.
        "OPTIONS": {"charset": "utf8mb4",
                    **({"isolation_level": os.environ["MYSQLQ_TEST_ISOLATION"]}
                       if os.environ.get("MYSQLQ_TEST_ISOLATION") else {})},
        # "none" keeps connections open for good (persistent), as many sites run workers.
        "CONN_MAX_AGE": (None if os.environ.get("MYSQLQ_TEST_CONN_MAX_AGE") == "none"
                         else int(os.environ.get("MYSQLQ_TEST_CONN_MAX_AGE", "0"))),
        # One test database per checkout, so two clones can run the suite side by side.
        "TEST": {"NAME": _TEST_DB, "CHARSET": "utf8mb4"},
    }
}
MYSQLQ: dict[str, Any] = {
    "HEARTBEAT_SECONDS": float(os.environ.get("MYSQLQ_TEST_HEARTBEAT", "1")),
    "LEASE_SECONDS": float(os.environ.get("MYSQLQ_TEST_LEASE", "10")),
    "RECOVERY_SECONDS": float(os.environ.get("MYSQLQ_TEST_RECOVERY", "0.5")),
    "WAKEUP": os.environ.get("MYSQLQ_TEST_WAKEUP", "1") == "1",
    "POLL_SECONDS": 0.2,
    "RETRY_BACKOFF": 0.1,
    "GRACE_SECONDS": float(os.environ.get("MYSQLQ_TEST_GRACE", "10")),
    "SUMMARY_SECONDS": float(os.environ.get("MYSQLQ_TEST_SUMMARY", "0")),
    "PURGE_LAG_WARNING_SECONDS": float(os.environ.get("MYSQLQ_TEST_PURGE_LAG_SECONDS", "300")),
    "LIVENESS": os.environ.get("MYSQLQ_TEST_LIVENESS", "connection"),
    "ACK_BATCH_SIZE": int(os.environ.get("MYSQLQ_TEST_ACK_BATCH", "20")),
    "ACK_DELAY_SECONDS": float(os.environ.get("MYSQLQ_TEST_ACK_DELAY", "0.02")),
    "UPKEEP_LOCK_WAIT_SECONDS": int(os.environ.get("MYSQLQ_TEST_UPKEEP_LOCK_WAIT", "2")),
}
# More queue databases on other servers (tests/test_multidb.py): only a test that started
# those servers (tests/multidb_support.py) names them, so they exist only when reachable.
if os.environ.get("MYSQLQ_TEST_EXTRA_DATABASES"):
    import json

    for _alias, _extra in json.loads(os.environ["MYSQLQ_TEST_EXTRA_DATABASES"]).items():
        DATABASES[_alias] = {**DATABASES["default"], "HOST": "127.0.0.1",
                             "PORT": int(_extra["PORT"]), "NAME": _extra["NAME"],
                             "TEST": {"NAME": _extra["NAME"], "CHARSET": "utf8mb4"}}
if os.environ.get("MYSQLQ_TEST_QUEUES"):
    import json

    MYSQLQ["QUEUES"] = json.loads(os.environ["MYSQLQ_TEST_QUEUES"])
if os.environ.get("MYSQLQ_TEST_READ_DATABASE"):
    import json

    MYSQLQ["READ_DATABASE"] = json.loads(os.environ["MYSQLQ_TEST_READ_DATABASE"])
if os.environ.get("MYSQLQ_TEST_TOPIC_WINDOW"):  # tests/test_topic_window.py's workers
    MYSQLQ["TOPIC_WINDOW"] = int(os.environ["MYSQLQ_TEST_TOPIC_WINDOW"])
if os.environ.get("MYSQLQ_TEST_DEAD_RETENTION"):  # tests/test_retention.py's worker
    MYSQLQ["DEAD_RETENTION_SECONDS"] = float(os.environ["MYSQLQ_TEST_DEAD_RETENTION"])
if os.environ.get("MYSQLQ_TEST_SIGNAL_RACE"):  # tests/test_stop_deadline.py's worker
    from tests import signal_race

    signal_race.install()
if os.environ.get("MYSQLQ_TEST_STALL_AT"):  # tests/test_topic_kill_steps.py's worker
    from tests import stall_at

    stall_at.install()
if os.environ.get("MYSQLQ_TEST_CLAIM_WATCH"):  # tests/test_parked_claims.py's worker
    from tests import claim_watch

    claim_watch.install()
if os.environ.get("MYSQLQ_TEST_EXITING_RECEIVERS"):  # tests/test_signal_receivers.py's worker
    from tests import exiting_receivers

    exiting_receivers.install()
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_mysqlq": {"handlers": ["stderr"], "level": "INFO"}},
}


def _tasks_framework() -> str | None:
    """``django.tasks`` (Django 6), the ``django_tasks`` backport (Django 5.2), or None."""
    import importlib.util

    for name in ("django.tasks", "django_tasks"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


_framework = _tasks_framework()
if _framework is not None:
    # Django's Tasks framework on this queue: tests/test_tasks_backend.py.
    if _framework == "django_tasks":
        INSTALLED_APPS.append("django_tasks")
    TASKS = {
        "default": {
            "BACKEND": "django_mysqlq.backend.MySQLQueueBackend",
            "QUEUES": ["default", "other"],
            "OPTIONS": {"max_attempts": 3, "retry_backoff": 0.1},
        },
        "single": {
            "BACKEND": "django_mysqlq.backend.MySQLQueueBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"max_attempts": 1},
        },
        "plain": {  # no OPTIONS: Django's expectations (one attempt)
            "BACKEND": "django_mysqlq.backend.MySQLQueueBackend",
            "QUEUES": ["default"],
        },
        "immediate": {
            "BACKEND": f"{_framework}.backends.immediate.ImmediateBackend",
        },
    }
    MYSQLQ["TASK_MODULES"] = ["tests.testapp.djtasks"]
    # The frameworks log failed tasks with their traceback; show it in worker logs.
    for _logger in ("django.tasks", "django_tasks"):
        LOGGING["loggers"][_logger] = {"handlers": ["stderr"], "level": "WARNING",
                                       "propagate": False}
# A worker of the "next release": it knows tasks the others don't (tests/test_deploys.py).
if os.environ.get("MYSQLQ_TEST_EXTRA_TASK_MODULES"):
    MYSQLQ["TASK_MODULES"] = [*MYSQLQ.get("TASK_MODULES", []),
                              *os.environ["MYSQLQ_TEST_EXTRA_TASK_MODULES"].split(",")]

# Recurring tasks declared in settings (tests/test_schedule_workers.py), as JSON.
if os.environ.get("MYSQLQ_TEST_SCHEDULES"):
    import json

    MYSQLQ["SCHEDULES"] = json.loads(os.environ["MYSQLQ_TEST_SCHEDULES"])
if os.environ.get("MYSQLQ_TEST_SCHEDULE_GRACE"):
    MYSQLQ["SCHEDULE_GRACE_SECONDS"] = float(os.environ["MYSQLQ_TEST_SCHEDULE_GRACE"])

# How a worker logs under other projects' logging (tests/test_worker_logging.py):
# "django-default" is no LOGGING at all (Django's own defaults), "root" a LOGGING that gives
# the root logger a handler and django_mysqlq none.
if os.environ.get("MYSQLQ_TEST_LOGGING") == "django-default":
    del LOGGING
elif os.environ.get("MYSQLQ_TEST_LOGGING") == "root":
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"stderr": {"class": "logging.StreamHandler"}},
        "root": {"handlers": ["stderr"], "level": "INFO"},
    }
elif os.environ.get("MYSQLQ_TEST_LOGGING") == "raising":
    # A project handler whose emit raises on every attempt line (a webhook that is down):
    # logging's Handler.handle does not catch it (tests/test_worker_logging.py).
    LOGGING["handlers"]["raising"] = {"class": "tests.testapp.logs.RaisingOnAttempts"}
    LOGGING["loggers"]["django_mysqlq"]["handlers"] = [
        *LOGGING["loggers"]["django_mysqlq"]["handlers"], "raising"]
if os.environ.get("MYSQLQ_TEST_DEBUG") == "1":
    DEBUG = True
if os.environ.get("MYSQLQ_TEST_LOG_FORMAT"):
    MYSQLQ["LOG_FORMAT"] = os.environ["MYSQLQ_TEST_LOG_FORMAT"]
