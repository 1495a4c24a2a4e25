"""MYSQLQ validation and the system checks."""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError

from django_mysqlq.checks import (
    check_binlog_format,
    check_immediate_in_production,
    check_isolation_level,
    check_queue_databases,
    check_settings,
    check_task_modules,
)
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
    ({"UPKEEP_LOCK_WAIT_SECONDS": 0}, "UPKEEP_LOCK_WAIT_SECONDS"),
    ({"UPKEEP_LOCK_WAIT_SECONDS": 1.5}, "must be an integer from 1 to 3600"),
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
def test_a_read_database_key_that_holds_no_queues_is_E011(settings):
    # A typo in a key sent every read silently to the primary, and passed every check.
    settings.DATABASES = {**settings.DATABASES, "replica": {**settings.DATABASES["default"]}}
    settings.MYSQLQ = {"READ_DATABASE": {"defualt": "replica"}}
    [error] = check_queue_databases()
    assert error.id == "django_mysqlq.E011"
    assert "MYSQLQ['READ_DATABASE'] has the key 'defualt', which is not an alias that " \
        "holds queues" in error.msg
    assert "Key it by a queue database alias: default" in error.hint
    settings.MYSQLQ = {"READ_DATABASE": {"default": "replica"}}
    assert check_queue_databases() == []
    settings.MYSQLQ = {"READ_DATABASE": {"replica": "default"}}  # holds no queues either
    assert ids(check_queue_databases()) == ["django_mysqlq.E011"]

    class Router:  # may place any queue on "replica": the key can't be judged
        def db_for_queue(self, queue: str) -> str | None:
            return None

    settings.DATABASE_ROUTERS = [Router()]
    assert check_queue_databases() == []
    settings.MYSQLQ = {"READ_DATABASE": {"defualt": "replica"}}  # not an alias at all
    assert ids(check_queue_databases()) == ["django_mysqlq.E011"]


@pytest.fixture
def routed_task():
    """A task on a queue only a router places (removed from the registry afterwards)."""
    from django_mysqlq import queue_task
    from django_mysqlq.registry import registry

    task = queue_task(queue="checks_routed", name="tests.checks.routed")(lambda: None)
    yield task
    registry._tasks.pop(task.name, None)


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_router_placing_a_queue_on_an_unknown_alias_is_E013(settings, routed_task):
    # It passed every check; workers and enqueues then failed with ConnectionDoesNotExist.
    class Router:
        def db_for_queue(self, queue: str) -> str | None:
            return "nowhere" if queue == "checks_routed" else None

    settings.MYSQLQ = {}
    settings.DATABASE_ROUTERS = [Router()]
    [error] = check_queue_databases()
    assert error.id == "django_mysqlq.E013"
    assert error.msg == ("A database router's db_for_queue places the queue(s) "
                         "'checks_routed' on 'nowhere', which is not in DATABASES.")
    assert "Make db_for_queue return one of: default" in error.hint
    assert "or add the alias to DATABASES" in error.hint
    settings.MYSQLQ = {"QUEUES": {"checks_routed": {"DATABASE": "default"}}}  # wins
    assert check_queue_databases() == []
    settings.DATABASES = {**settings.DATABASES, "nowhere": {
        "ENGINE": "django.db.backends.sqlite3"}}
    settings.MYSQLQ = {}
    [error] = check_queue_databases()
    assert (error.id, error.msg.endswith("which is not MySQL or MariaDB.")) == (
        "django_mysqlq.E013", True)
    settings.MYSQLQ = {"IMMEDIATE": True}
    assert check_queue_databases() == []


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_non_mysql_engine_is_E003_and_says_what_to_do_in_tests(settings):
    settings.DATABASES = {**settings.DATABASES, "lite": {"ENGINE": "django.db.backends.sqlite3"}}
    settings.MYSQLQ = {"DATABASE": "lite"}
    [error] = check_settings()
    assert error.id == "django_mysqlq.E003"
    assert "needs MySQL or MariaDB" in error.hint
    assert "MYSQLQ = {'IMMEDIATE': True}" in error.hint


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_the_test_mode_needs_no_mysql(settings):
    settings.DATABASES = {**settings.DATABASES, "lite": {"ENGINE": "django.db.backends.sqlite3"}}
    settings.MYSQLQ = {"DATABASE": "lite", "IMMEDIATE": True}
    assert check_settings() == []
    # The MySQL-only checks keep out of another vendor's way.
    assert check_binlog_format(databases=["lite"]) == []
    settings.DATABASES = {**settings.DATABASES, "lite": {
        "ENGINE": "django.db.backends.sqlite3", "OPTIONS": {"isolation_level": "x"}}}
    assert check_isolation_level() == []


@pytest.mark.parametrize("value", [1, "yes", None])
def test_immediate_settings_are_booleans(settings, value):
    settings.MYSQLQ = {"IMMEDIATE": value, "IMMEDIATE_RAISE": value}
    assert [e.msg for e in check_settings()] == [
        f"MYSQLQ['IMMEDIATE'] must be True or False, not {value!r}.",
        f"MYSQLQ['IMMEDIATE_RAISE'] must be True or False, not {value!r}."]


def test_the_test_mode_is_a_deploy_warning(settings):
    assert check_immediate_in_production() == []
    settings.MYSQLQ = {"IMMEDIATE": True}
    [warning] = check_immediate_in_production()
    assert warning.id == "django_mysqlq.W003" and isinstance(warning, checks.Warning)
    assert "IMMEDIATE" in warning.msg and "tests" in warning.hint
    mine = [check for check in checks.registry.registry.get_checks(True)
            if check.__module__ == "django_mysqlq.checks"]
    assert check_immediate_in_production in mine
    assert check_immediate_in_production not in checks.registry.registry.get_checks(False)


def test_a_task_module_that_does_not_exist_is_E005(settings):
    settings.MYSQLQ = {"TASK_MODULES": ["tests.testapp.nope", "tests.testapp.tasks"]}
    [error] = check_task_modules()
    assert error.id == "django_mysqlq.E005"
    assert error.msg == ("MYSQLQ['TASK_MODULES'] lists 'tests.testapp.nope', which can't be "
                         "imported: no module named 'tests.testapp.nope' exists.")
    assert "dotted module path" in error.hint
    settings.MYSQLQ = {"TASK_MODULES": ["nowhere.at_all"]}
    [error] = check_task_modules()
    assert "ModuleNotFoundError: No module named 'nowhere'" in error.msg
    settings.MYSQLQ = {"TASK_MODULES": ["tests/testapp/tasks.py"]}
    [error] = check_task_modules()
    assert error.id == "django_mysqlq.E005"


def test_a_task_module_that_fails_inside_is_E005_with_the_import_error(settings):
    settings.MYSQLQ = {"TASK_MODULES": ["tests.testapp.broken_tasks"]}
    [error] = check_task_modules()
    assert error.msg == (
        "MYSQLQ['TASK_MODULES'] lists 'tests.testapp.broken_tasks', which can't be imported: "
        "ModuleNotFoundError: No module named 'not_an_installed_dependency'")
    assert check_task_modules in checks.registry.registry.get_checks(False)


def test_the_worker_start_error_names_the_module_too(settings):
    from django.core.exceptions import ImproperlyConfigured

    from django_mysqlq.registry import import_task_modules

    settings.MYSQLQ = {"TASK_MODULES": ["tests.testapp.broken_tasks"]}
    with pytest.raises(ImproperlyConfigured, match=(
            r"^Could not import the task module 'tests.testapp.broken_tasks' "
            r"\(MYSQLQ\['TASK_MODULES'\] lists it\): ModuleNotFoundError: No module named "
            "'not_an_installed_dependency'")):
        import_task_modules()


def test_good_task_modules_pass(settings):
    assert check_task_modules() == []


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
    with pytest.raises(CommandError, match="comma-separated queue names"):
        call_command("runqueueworker", "--queues", "a,,b")
    # (--groups said "queue names" too.)
    with pytest.raises(CommandError, match="--groups: expected comma-separated group names"):
        call_command("runqueueworker", "--groups", "billing,,audit")


@pytest.mark.compat
@pytest.mark.worker
def test_a_worker_refuses_to_start_on_a_broken_task_module_without_a_traceback(start_worker):
    worker = start_worker("--burst", env={
        "MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.broken_tasks"})
    assert worker.wait(timeout=60) != 0
    output = worker.output()
    assert "(django_mysqlq.E005) MYSQLQ['TASK_MODULES'] lists 'tests.testapp.broken_tasks', " \
           "which can't be imported: ModuleNotFoundError: No module named " \
           "'not_an_installed_dependency'" in output
    assert "Traceback" not in output
