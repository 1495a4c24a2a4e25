"""MYSQLQ validation and the system checks."""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError

from django_mysqlq.checks import check_binlog_format, check_settings
from django_mysqlq.conf import QueueSettings, get_settings


def ids(messages):
    return [m.id for m in messages]


def test_defaults_when_the_setting_is_empty(settings):
    settings.MYSQLQ = {}
    assert get_settings() == QueueSettings()
    assert check_settings() == []


def test_override_settings_is_seen_at_once(settings):
    settings.MYSQLQ = {"BATCH_SIZE": 77}
    assert get_settings().BATCH_SIZE == 77
    settings.MYSQLQ = {"BATCH_SIZE": 5}
    assert get_settings().BATCH_SIZE == 5


@pytest.mark.parametrize("value, fragment", [
    ({"BATCH_SIZE": 0}, "BATCH_SIZE"),
    ({"BATCH_SIZE": "10"}, "must be an integer"),
    ({"LEASE_SECONDS": -1}, "LEASE_SECONDS"),
    ({"LIVENESS": "process"}, "'connection' or 'lease'"),
    ({"DEFAULT_PRIORITY": 500}, "-100 to 100"),
    ({"UNKNOWN": 1}, "not a known setting"),
    ({"TASK_MODULES": "app.tasks"}, "list of dotted module paths"),
    ({"HEARTBEAT_SECONDS": 20, "LEASE_SECONDS": 30}, "at most half"),
    ({"DATABASE": ""}, "non-empty string"),
    ({"DEFAULT_QUEUE": "q" * 65}, "at most 64"),
    ({"TASK_MODULES": 5}, "list of dotted module paths"),
    ({"POLL_SECONDS": float("nan")}, "finite number"),
    ({"BATCH_SIZE": float("inf")}, "must be an integer"),
])
def test_bad_values_are_reported_as_E001(settings, value, fragment):
    settings.MYSQLQ = value
    [error] = check_settings()
    assert error.id == "django_mysqlq.E001"
    assert fragment in error.msg
    assert error.hint


def test_all_problems_are_reported_at_once(settings):
    settings.MYSQLQ = {"BATCH_SIZE": 0, "LIVENESS": "x", "NOPE": 1}
    assert ids(check_settings()) == ["django_mysqlq.E001"] * 3


def test_not_a_dict(settings):
    settings.MYSQLQ = ["BATCH_SIZE", 3]
    [error] = check_settings()
    assert "must be a dict" in error.msg


def test_unknown_database_alias_is_E002(settings):
    settings.MYSQLQ = {"DATABASE": "queue"}
    assert ids(check_settings()) == ["django_mysqlq.E002"]


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_non_mysql_engine_is_E003(settings):
    settings.DATABASES = {**settings.DATABASES, "lite": {"ENGINE": "django.db.backends.sqlite3"}}
    settings.MYSQLQ = {"DATABASE": "lite"}
    assert ids(check_settings()) == ["django_mysqlq.E003"]


def test_use_tz_false_is_E004(settings):
    settings.USE_TZ = False
    assert ids(check_settings()) == ["django_mysqlq.E004"]


@pytest.mark.django_db
def test_binlog_format_statement_warns(django_db_blocker):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.binlog_format")
        original = cursor.fetchone()[0]
        cursor.execute("SET GLOBAL binlog_format = 'STATEMENT'")
    try:
        [warning] = check_binlog_format(databases=["default"])
        assert warning.id == "django_mysqlq.W001"
        assert isinstance(warning, checks.Warning)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET GLOBAL binlog_format = %s", [original])
    assert check_binlog_format(databases=["default"]) == []


def test_the_command_refuses_bad_arguments_clearly():
    with pytest.raises(CommandError, match="at least 1"):
        call_command("runqueueworker", "--concurrency", "0")
    with pytest.raises(CommandError, match="listed twice"):
        call_command("runqueueworker", "--queues", "a,a")
    with pytest.raises(CommandError, match="comma-separated"):
        call_command("runqueueworker", "--queues", "a,,b")
