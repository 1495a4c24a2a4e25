"""The library's MySQL 8 code paths, run against MariaDB.

No MySQL 8 server can be installed here (Debian 12 has no ``mysql-server``; no PyPI or
npm package ships one: the npm ones download it at run time), so the branches the library
takes when ``connection.mysql_is_mariadb`` is false are forced on MariaDB: in this
process by overriding the flag on the test's connection, and in a real worker subprocess
through ``tests.mysqlpaths``, Django's MySQL backend that calls the server MySQL. What
MariaDB accepts here, MySQL 8 documents too: plain ``INSERT`` with ``LAST_INSERT_ID()``,
``SET SESSION innodb_lock_wait_timeout``, ``SET TRANSACTION`` (error 1568 inside one),
``SELECT … FOR UPDATE SKIP LOCKED``. The differences only MySQL itself would show are
listed in docs/scaling.md.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction

from django_mysqlq import broker
from django_mysqlq.broker import locked
from django_mysqlq.models import Attempt, Message
from tests.conftest import ROOT
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def as_mysql() -> Iterator[None]:
    """This thread's connection takes the MySQL branches until the test ends."""
    wrapper = connections["default"]  # (``connection`` is a proxy to it)
    wrapper.ensure_connection()
    assert wrapper.mysql_is_mariadb
    wrapper.__dict__["mysql_is_mariadb"] = False  # Django caches the real answer there
    try:
        yield
    finally:
        wrapper.__dict__.pop("mysql_is_mariadb", None)
        wrapper.close()


def session_variable(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT @@SESSION.{name}")
        return str(cursor.fetchone()[0])


def test_enqueue_many_inserts_one_by_one_and_returns_every_id_in_order(as_mysql):
    calls = [tasks.record.call(f"m{i}", i) for i in range(5)]
    statements: list[str] = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(count):
        ids = [handle.id for handle in tasks.record.enqueue_many(calls)]
    assert not any("RETURNING" in sql for sql in statements)
    inserts = [sql for sql in statements if sql.lstrip().startswith("INSERT INTO mysqlq_message")]
    assert len(inserts) == 5
    assert ids == sorted(ids)
    rows = dict(Message.objects.filter(id__in=ids).values_list("id", "payload"))
    assert [f'"m{i}"' in rows[message_id] for i, message_id in enumerate(ids)] == [True] * 5


def test_a_stop_deadline_bounds_lock_waits_only_and_is_lifted(as_mysql):
    default_wait = session_variable("innodb_lock_wait_timeout")
    default_statement = session_variable("max_statement_time")
    broker.finish_by(time.monotonic() + 3.2)
    try:
        broker.release_strays("nobody")  # a bounded statement (with_lock_retry)
        assert session_variable("innodb_lock_wait_timeout") == "4"
        # MySQL's max_execution_time bounds SELECTs only: MariaDB's is left alone.
        assert session_variable("max_statement_time") == default_statement
    finally:
        broker.finish_by(None)
    assert session_variable("innodb_lock_wait_timeout") == default_wait


def test_the_short_lock_wait_is_set_on_the_session_not_per_statement(as_mysql):
    """MySQL can't scope an InnoDB variable to one statement (no SET STATEMENT)."""
    sql = locked.short_wait(connection, "SELECT 1")
    assert sql == "SELECT 1"
    assert session_variable("innodb_lock_wait_timeout") == str(locked.LOCK_WAIT_SECONDS)


def test_the_fast_statements_keep_the_short_wait_on_mysql(as_mysql):
    """MySQL's smallest innodb_lock_wait_timeout is 1 s (MariaDB's fast statements wait for
    no row lock): the claim and the promotion wait that long on the session's wait."""
    sql = locked.no_wait(connection, "SELECT 1")
    assert sql == "SELECT 1"
    assert session_variable("innodb_lock_wait_timeout") == str(locked.LOCK_WAIT_SECONDS)


def test_a_claim_steps_around_a_locked_row_on_the_mysql_path(as_mysql):
    first = tasks.record.enqueue("locked").id
    second = tasks.record.enqueue("free").id
    holding, release = threading.Event(), threading.Event()

    def hold_row_lock() -> None:
        with transaction.atomic(), connections["default"].cursor() as cursor:
            cursor.execute("SELECT id FROM mysqlq_message WHERE id = %s FOR UPDATE", [first])
            holding.set()
            release.wait(30)
        connections.close_all()

    holder = threading.Thread(target=hold_row_lock)
    holder.start()
    locked.LOCKED_ROWS.forget()
    try:
        assert holding.wait(10)
        claimed = broker.claim(["default"], 2, "w-mysql", 30.0)
        assert [m.id for m in claimed] == [second]
    finally:
        release.set()
        holder.join()
        locked.LOCKED_ROWS.forget()


def test_the_backend_of_the_worker_subprocess_takes_the_mysql_paths(worker_env):
    done = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c",
         "from django.db import connection; connection.ensure_connection(); "
         "print(connection.vendor, connection.mysql_is_mariadb, connection.display_name)"],
        env={**worker_env, "MYSQLQ_TEST_ENGINE": "tests.mysqlpaths"}, capture_output=True,
        text=True, timeout=60, cwd=str(ROOT))
    assert done.stdout.splitlines()[-1].split() == ["mysql", "False", "MySQL"], done.stderr


@pytest.mark.worker
def test_a_worker_on_the_mysql_paths_runs_retries_and_acks_everything(start_worker):
    for i in range(30):
        tasks.record.enqueue(f"r{i}", i)
    tasks.atomic_record.enqueue("atomic")
    tasks.fails_until.enqueue("flaky", 2)
    tasks.record.enqueue_many([tasks.record.call(f"bulk{i}") for i in range(20)])
    worker = start_worker("--burst", "--concurrency", "3",
                          env={"MYSQLQ_TEST_ENGINE": "tests.mysqlpaths"})
    assert worker.wait(90) == 0, worker.output()
    labels = list(Ledger.objects.values_list("label", flat=True))
    assert sorted(set(labels)) == sorted({f"r{i}" for i in range(30)}
                                         | {f"bulk{i}" for i in range(20)}
                                         | {"atomic", "flaky"})
    assert labels.count("flaky") == 2  # failed once, retried, succeeded
    assert Message.objects.count() == 0
    outcomes = sorted(Attempt.objects.values_list("outcome", flat=True))
    assert outcomes.count("succeeded") == 52 and outcomes.count("retried") == 1
