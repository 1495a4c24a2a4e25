"""A worker the database can't serve exits at once, saying what to do, instead of hanging.

Each test points real ``runqueueworker`` processes at a database of its own: an empty
one (a worker started before ``migrate``), one that doesn't exist, a refused login, or a
copy of the queue's tables that the test then drops under the running worker.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from django.db import connection

from django_mysqlq.worker.fatal import EXIT_CANNOT_RUN
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

#: A worker that can't run must say so well within this (it used to retry forever).
PATIENCE = 30.0


def queue_tables() -> list[str]:
    """Every table the app's migrations make (a new one is copied too)."""
    from django.apps import apps

    return sorted({model._meta.db_table
                   for model in apps.get_app_config("django_mysqlq").get_models()
                   if not model._meta.proxy})


@pytest.fixture
def scratch_db() -> Iterator[str]:
    """An empty database beside the test database, dropped afterwards."""
    name = f"{connection.settings_dict['NAME']}_scratch"[:64]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def migrated_scratch_db(scratch_db: str) -> str:
    """The scratch database with copies of the queue's (empty) tables."""
    source = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        for table in queue_tables():
            cursor.execute(f"CREATE TABLE `{scratch_db}`.`{table}` LIKE `{source}`.`{table}`")
    return scratch_db


def ended(worker, patience: float = PATIENCE) -> tuple[int, str]:
    try:
        status = worker.wait(timeout=patience)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker was still running after {patience}s:\n"
                    f"{worker.output()[-3000:]}")
    return status, worker.output()


@pytest.mark.parametrize("mode", [(), ("--burst",), ("--processes", "2")],
                         ids=["daemon", "burst", "processes"])
def test_a_worker_started_before_migrate_exits_at_once_saying_run_migrate(
        start_worker, scratch_db, mode):
    worker = start_worker(*mode, env={"MYSQLQ_TEST_DB": scratch_db})
    status, output = ended(worker)
    assert status == EXIT_CANNOT_RUN, output
    assert (f"CommandError: The queue's tables are missing from database '{scratch_db}' "
            f"(error 1146: Table '{scratch_db}.mysqlq_worker' doesn't exist): run "
            "`manage.py migrate` then start the worker again.") in output
    assert "retrying" not in output
    assert "Supervisor started worker process" not in output  # no child forked for nothing


@pytest.mark.parametrize("skip_checks", [False, True], ids=["checks", "skip-checks"])
def test_an_unknown_database_ends_the_worker_with_what_to_do(start_worker, scratch_db,
                                                             skip_checks):
    missing = f"{scratch_db}_missing"[:64]
    worker = start_worker("--burst", *(["--skip-checks"] if skip_checks else []),
                          env={"MYSQLQ_TEST_DB": missing})
    status, output = ended(worker)
    assert status == EXIT_CANNOT_RUN, output
    assert (f"CommandError: Database '{missing}' does not exist on the server (error 1049: "
            f"Unknown database '{missing}'): create it (or fix DATABASES['default']['NAME']), "
            "then run `manage.py migrate`.") in output
    assert "Traceback" not in output


def test_a_refused_login_ends_a_daemon_at_start(start_worker):
    worker = start_worker("--skip-checks", env={"MYSQLQ_TEST_PASSWORD": "not-the-password"})
    status, output = ended(worker)
    assert status == EXIT_CANNOT_RUN, output
    assert "CommandError: The database server refused the login or the database (error 1045:" \
        in output
    assert "check USER, PASSWORD and HOST in DATABASES['default']" in output


def _only_the_workers_table(scratch_db: str) -> None:
    """A partial upgrade: the scratch database has the workers table and nothing else."""
    source = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE `{scratch_db}`.`mysqlq_worker` "
                       f"LIKE `{source}`.`mysqlq_worker`")


def _worker_rows(scratch_db: str) -> tuple[int, int]:
    """The scratch database's worker rows, and how many of them are marked stopped."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*), COUNT(stopped_at) FROM `{scratch_db}`.`mysqlq_worker`")
        return cursor.fetchone()


def test_a_half_migrated_database_ends_the_worker_and_leaves_no_live_row(start_worker,
                                                                        scratch_db):
    """Only the workers table exists: the worker registers, then its first read of the
    other tables (its schedules, then the messages) fails. Its row must not go on saying
    that it serves its queues."""
    _only_the_workers_table(scratch_db)
    worker = start_worker(env={"MYSQLQ_TEST_DB": scratch_db})
    status, output = ended(worker)
    assert status == EXIT_CANNOT_RUN, output
    assert f"Table '{scratch_db}.mysqlq_schedule' doesn't exist" in output
    assert _worker_rows(scratch_db) == (1, 1)  # registered, then marked stopped


def test_a_group_member_without_the_topic_tables_leaves_no_live_row(start_worker,
                                                                     scratch_db):
    """A partial upgrade: the workers table is there, the topic tables are not. A member
    of a consumer group registers, then creating its group fails: its row must not go on
    saying that it serves its queues (it did: the topics' start was outside the guard)."""
    _only_the_workers_table(scratch_db)
    worker = start_worker("--groups", "ops", env={
        "MYSQLQ_TEST_DB": scratch_db,
        "MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.topic_ops_handlers"})
    status, output = ended(worker)
    assert status == EXIT_CANNOT_RUN, output
    assert f"Table '{scratch_db}.mysqlq_topic" in output
    assert _worker_rows(scratch_db) == (1, 1)  # registered, then marked stopped


def test_tables_dropped_under_a_running_worker_end_it(start_worker, migrated_scratch_db):
    worker = start_worker(env={"MYSQLQ_TEST_DB": migrated_scratch_db})
    wait_for(lambda: " started: " in worker.output(), timeout=PATIENCE,
             message="the worker to start")
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE `{migrated_scratch_db}`.`mysqlq_message`")
    status, output = ended(worker)
    assert status == EXIT_CANNOT_RUN, output
    assert f"Table '{migrated_scratch_db}.mysqlq_message' doesn't exist" in output
    assert "run `manage.py migrate`" in output


def test_a_supervisor_stops_and_replaces_no_child_once_the_tables_are_gone(
        start_worker, migrated_scratch_db):
    supervisor = start_worker("--processes", "2", env={"MYSQLQ_TEST_DB": migrated_scratch_db})
    wait_for(lambda: supervisor.output().count(" started: ") == 2, timeout=PATIENCE,
             message="both children to start")
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE `{migrated_scratch_db}`.`mysqlq_message`")
    status, output = ended(supervisor)
    assert status == EXIT_CANNOT_RUN, output
    assert "can't run until the database is fixed; stopping the others" in output
    assert "replacing it" not in output
    assert output.count("Supervisor started worker process") == 2


def test_an_outage_is_still_ridden_out(start_worker, migrated_scratch_db):
    """Not every error is permanent: a worker whose connection is killed goes on."""
    worker = start_worker(env={"MYSQLQ_TEST_DB": migrated_scratch_db})
    wait_for(lambda: " started: " in worker.output(), timeout=PATIENCE,
             message="the worker to start")
    with connection.cursor() as cursor:
        cursor.execute("SELECT connection_id FROM "
                       f"`{migrated_scratch_db}`.`mysqlq_worker` WHERE stopped_at IS NULL")
        [(control,)] = cursor.fetchall()
        cursor.execute(f"KILL {int(control)}")
    # It notices at its next statement (logged), unless that statement comes after a
    # check that found the connection gone and opened another one quietly (seen once in
    # CI): either way the claim is that it goes on.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and \
            "Database error in the worker loop" not in worker.output():
        time.sleep(0.1)
    assert worker.popen.poll() is None, worker.output()
    worker.signal(signal.SIGTERM)
    status, output = ended(worker)
    assert status == 0, output


@pytest.mark.parametrize(("code", "started", "burst", "ends"), [
    (1146, True, False, True),    # tables gone under a running daemon
    (1054, True, False, True),
    (1045, False, False, True),   # a refused login at start
    (1142, True, True, True),     # a grant revoked during a --burst run
    (1142, True, False, False),   # ... under a running daemon: ridden out, at ERROR
    (1049, True, False, False),
    (2013, False, True, False),   # a lost connection is an outage, whatever the mode
    (1205, True, True, False),
])
def test_which_errors_end_a_worker(code, started, burst, ends):
    from django.db import OperationalError

    from django_mysqlq.exceptions import WorkerCannotRun
    from django_mysqlq.worker import fatal

    error = OperationalError(code, "the server's text")
    if ends:
        with pytest.raises(WorkerCannotRun) as raised:
            fatal.check(error, started=started, burst=burst)
        assert raised.value.exit_status == EXIT_CANNOT_RUN
        assert f"(error {code}: the server's text)" in str(raised.value)
    else:
        fatal.check(error, started=started, burst=burst)


def test_the_advice_names_the_queue_database_alias():
    from django.db import ProgrammingError
    from django.test import override_settings

    from django_mysqlq.worker import fatal

    error = ProgrammingError(1146, "Table 'q.mysqlq_worker' doesn't exist")
    with override_settings(MYSQLQ={"DATABASE": "queue"}):
        problem = fatal.describe(error)
    assert problem is not None
    assert problem.endswith("(error 1146: Table 'q.mysqlq_worker' doesn't exist): run "
                            "`manage.py migrate --database queue` then start the worker again.")


@pytest.fixture
def empty_topics_database(scratch_db: str, settings) -> Iterator[str]:
    """``MYSQLQ['DATABASE']`` (where topics live) is the alias ``topics_scratch``: the
    empty scratch database; ``default`` keeps its tables. Its connection is made here and
    its alias left out of the handler's settings afterwards: Django's test case allows a
    connection created so (one it knows the alias of would be refused to this test)."""
    from django.db import connections

    alias = "topics_scratch"
    database = {**connections.settings["default"], "NAME": scratch_db}
    connections.settings[alias] = database
    connections[alias]  # made now, while the handler knows the alias
    del connections.settings[alias]
    settings.DATABASES = {**settings.DATABASES, alias: database}
    settings.MYSQLQ = {**settings.MYSQLQ, "DATABASE": alias}
    try:
        yield alias
    finally:
        connections[alias].close()
        del connections[alias]


def begin_broadcast_from_default() -> str | None:
    """A worker of ``default`` starts its broadcast reader (on the topics' database):
    the advice for what it raises."""
    import threading
    from types import SimpleNamespace

    from django.db import DatabaseError

    from django_mysqlq import broker
    from django_mysqlq.worker import fatal
    from django_mysqlq.worker.topics import BroadcastReader

    reader = BroadcastReader([SimpleNamespace(topic="fatal_topic")],  # type: ignore[list-item]
                             threading.Event(), 1.0)
    broker.bind_alias("default")  # the worker's thread
    try:
        with pytest.raises(DatabaseError) as raised:
            reader.begin()
        return fatal.describe(raised.value)
    finally:
        broker.bind_alias(None)


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_the_advice_names_the_topics_database_when_its_tables_are_missing(
        empty_topics_database, scratch_db):
    """The advice named the worker's own database, whose tables exist."""
    problem = begin_broadcast_from_default()
    assert problem is not None
    assert problem.startswith(f"The queue's tables are missing from database {scratch_db!r}")
    assert problem.endswith(f"run `manage.py migrate --database {empty_topics_database}` "
                            "then start the worker again.")


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_the_advice_names_the_topics_database_when_it_does_not_exist(
        empty_topics_database, scratch_db):
    """No table in the server's text: the reader notes the alias its statements ran on."""
    from django.db import connections

    with connections[empty_topics_database].cursor() as cursor:
        cursor.execute(f"DROP DATABASE `{scratch_db}`")
    connections[empty_topics_database].close()
    problem = begin_broadcast_from_default()
    assert problem is not None and problem.startswith(f"Database {scratch_db!r} does not exist")
    assert f"DATABASES['{empty_topics_database}']['NAME']" in problem


def test_a_missing_topic_table_is_the_topics_databases_whatever_the_thread_serves():
    from django.db import ProgrammingError
    from django.test import override_settings

    from django_mysqlq import broker
    from django_mysqlq.worker import fatal

    error = ProgrammingError(1146, "Table 'q.mysqlq_topic_message' doesn't exist")
    with override_settings(MYSQLQ={"DATABASE": "topics"}):
        broker.bind_alias("queues_b")
        try:
            problem = fatal.describe(error)
        finally:
            broker.bind_alias(None)
    assert problem is not None and "`manage.py migrate --database topics`" in problem


@pytest.mark.parametrize("command", [
    ("queuestats",), ("queueschedule",), ("queuetopic", "groups"),
    ("queuecancel", "--status", "ready"), ("queuerequeue",), ("queuepurge", "--older-than", "1d"),
    ("queuepause", "emails"), ("queuesubject", "show", "order:1")])
def test_operator_commands_before_migrate_say_run_migrate_not_a_traceback(scratch_db,
                                                                           command):
    import os
    import sys

    env = {**os.environ, "MYSQLQ_TEST_DB": scratch_db, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run([sys.executable, "-m", "django", *command], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_CANNOT_RUN, done.stderr
    assert "Traceback" not in done.stderr
    assert f"CommandError: The queue's tables are missing from database '{scratch_db}'" in \
        done.stderr
    assert "run `manage.py migrate` then run this command again." in done.stderr


@pytest.mark.parametrize("command", [
    ("queuehistory", "partitions"), ("queuepipeline", "report", "--output", "unwritten")])
@pytest.mark.parametrize("trouble", ["refused login", "unknown database"])
def test_history_and_pipeline_commands_say_a_database_error_in_one_line(scratch_db, command,
                                                                        trouble):
    # docs/operations.md: every command says what to do in one line and exits with 78.
    import os
    import sys

    missing = f"{scratch_db}_missing"[:64]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           **({"MYSQLQ_TEST_PASSWORD": "not-the-password"} if trouble == "refused login"
              else {"MYSQLQ_TEST_DB": missing})}
    done = subprocess.run([sys.executable, "-m", "django", *command], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_CANNOT_RUN, done.stderr
    assert "Traceback" not in done.stderr
    expected = ("CommandError: The database server refused the login or the database "
                "(error 1045:" if trouble == "refused login" else
                f"CommandError: Database '{missing}' does not exist on the server (error 1049:")
    assert expected in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("command", [("queuestats",), ("queuerequeue",),
                                     ("queuecancel", "--status", "ready")])
def test_operator_commands_name_the_database_option_s_alias(scratch_db, command):
    """The advice named ``default`` (migrated) for an error on ``--database queues_b``:
    the command had left that database by the time it described the error."""
    import json
    import os
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "MYSQLQ_TEST_DB": connection.settings_dict["NAME"],
           "MYSQLQ_TEST_EXTRA_DATABASES": json.dumps(
               {"queues_b": {"PORT": connection.settings_dict["PORT"] or 3306,
                             "NAME": scratch_db}}),
           "MYSQLQ_TEST_QUEUES": json.dumps({"emails": {"DATABASE": "queues_b"}})}
    done = subprocess.run([sys.executable, "-m", "django", *command, "--database", "queues_b"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_CANNOT_RUN, done.stderr
    assert f"The queue's tables are missing from database '{scratch_db}'" in done.stderr
    assert "`manage.py migrate --database queues_b`" in done.stderr
