"""A small project whose database is SQLite or PostgreSQL, for tests/test_non_mysql.py.

``manage.py check``, ``migrate``, ``runserver`` and ``test`` must work here with the test
mode on (MYSQLQ['IMMEDIATE']), and refuse with the fix without it. Environment:
NONMYSQL_ENGINE (``sqlite`` or ``postgresql``), NONMYSQL_NAME (the file or database),
NONMYSQL_IMMEDIATE (``1`` turns the test mode on), NONMYSQL_PG_USER.
"""

import importlib.util
import os

SECRET_KEY = "tests-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "tests.nonmysql.urls"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_mysqlq",
    "tests.nonmysql.shop",
]
if os.environ.get("NONMYSQL_ENGINE", "sqlite") == "postgresql":
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": 5432,
        "USER": os.environ.get("NONMYSQL_PG_USER", "postgres"),
        "NAME": os.environ["NONMYSQL_NAME"],
    }}
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                             "NAME": os.environ["NONMYSQL_NAME"]}}

MYSQLQ = {"IMMEDIATE": os.environ.get("NONMYSQL_IMMEDIATE") == "1"}

_framework = next((name for name in ("django.tasks", "django_tasks")
                   if importlib.util.find_spec(name) is not None), None)
if _framework is not None:
    if _framework == "django_tasks":
        INSTALLED_APPS.append("django_tasks")
    TASKS = {"default": {"BACKEND": "django_mysqlq.backend.MySQLQueueBackend",
                         "QUEUES": ["default"]}}
