"""The broker's own connections run at READ COMMITTED whatever level the site configures.

Under REPEATABLE READ the claim's ``UPDATE … LIMIT`` takes gap locks on the claim index:
claimers deadlock with each other and producers' inserts wait on them. Worker processes
here run with ``MYSQLQ_TEST_ISOLATION="repeatable read"`` (``tests/settings.py``).
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.db import connections, transaction

from django_mysqlq import broker
from django_mysqlq.broker.base import in_transaction
from django_mysqlq.checks import check_isolation_level
from django_mysqlq.models import Message, Worker
from tests.conftest import wait_for
from tests.kill_support import PATIENCE, kill_when_stalled, stalling_worker
from tests.test_kill_steps import STEPS
from tests.testapp import tasks
from tests.testapp.models import Ledger
from tests.thread_support import in_thread_with_default

pytestmark = [pytest.mark.django_db(transaction=True)]

REPEATABLE_READ = {"MYSQLQ_TEST_ISOLATION": "repeatable read"}
CLAIMERS = 4
MESSAGES = 1500


def _produce(count: int, errors: list[BaseException]) -> None:
    try:
        for start in range(0, count, 3):
            with transaction.atomic():  # like a view: a few messages per business write
                for index in range(start, min(start + 3, count)):
                    tasks.record.enqueue(f"m{index}")
    except BaseException as exc:  # noqa: BLE001 - any error reaching the producer fails the test
        errors.append(exc)
    finally:
        connections.close_all()


@pytest.mark.worker
def test_claimers_and_a_producer_meet_no_deadlock_under_a_repeatable_read_site(start_worker):
    workers = [start_worker("--concurrency", "2", "--batch", "5", env=REPEATABLE_READ)
               for _ in range(CLAIMERS)]
    wait_for(lambda: Worker.objects.filter(stopped_at__isnull=True).count() == CLAIMERS,
             message="the claimers to start")
    errors: list[BaseException] = []
    producer = threading.Thread(target=_produce, args=(MESSAGES, errors))
    producer.start()
    producer.join()
    assert errors == []
    wait_for(lambda: not Message.objects.exists(), timeout=120, interval=0.5,
             message="the claimers to drain the queue")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    conflicts = []
    for worker in workers:
        assert worker.wait(60) == 0, worker.output()
        found = re.findall(r"stopped: .*deadlocks=(\d+) lock_waits=(\d+)", worker.output())
        assert len(found) == 1, worker.output()
        conflicts.append(tuple(int(n) for n in found[0]))
    print(f"(deadlocks, lock waits) retried per claimer: {conflicts}")
    assert conflicts == [(0, 0)] * CLAIMERS


# --------------------------------------------------------------------------- the system check


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize("level", ["repeatable read", "SERIALIZABLE", None])
def test_a_queue_database_not_at_read_committed_is_W002(settings, level):
    queue_db = {**settings.DATABASES["default"], "OPTIONS": {"isolation_level": level}}
    settings.DATABASES = {**settings.DATABASES, "queue": queue_db}
    settings.MYSQLQ = {"DATABASE": "queue"}
    [warning] = check_isolation_level()
    assert isinstance(warning, checks.Warning)
    assert warning.id == "django_mysqlq.W002"
    assert "'queue'" in warning.msg and "read committed" in warning.msg
    assert "READ COMMITTED" in warning.hint and "tasks see your level" in warning.hint


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize("options", [{}, {"isolation_level": "read committed"},
                                     {"isolation_level": "READ COMMITTED"}])
def test_read_committed_or_django_s_default_passes(settings, options):
    queue_db = {**settings.DATABASES["default"], "OPTIONS": options}
    settings.DATABASES = {**settings.DATABASES, "queue": queue_db}
    settings.MYSQLQ = {"DATABASE": "queue"}
    assert check_isolation_level() == []


# --------------------------------------------------------------------------- connections


def _in_thread_at(level: str, body: Callable[[], Any]) -> Any:
    """Run ``body`` in a thread whose queue connection is configured at ``level``."""
    return in_thread_with_default(body, options={"isolation_level": level})


def _session_level() -> str:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT @@tx_isolation")
        return str(cursor.fetchone()[0])


def test_a_connection_the_broker_owns_is_read_committed_and_stays_so_after_a_reconnect():
    def body() -> list[str]:
        seen = [_session_level()]  # the site's level, before the broker owns it
        broker.own_connection()
        seen.append(_session_level())
        connections["default"].close()
        seen.append(_session_level())  # a fresh connection
        return seen

    assert _in_thread_at("repeatable read", body) == [
        "REPEATABLE-READ", "READ-COMMITTED", "READ-COMMITTED"]


def test_broker_transactions_on_a_task_s_connection_run_at_read_committed_once():
    """A task thread's session is the user's: only the broker's own transaction changes."""
    def observed_level(cursor: Any) -> str:
        """READ COMMITTED sees a row another connection commits mid-transaction."""
        cursor.execute("SELECT COUNT(*) FROM testapp_ledger")
        before = cursor.fetchone()[0]
        writer = threading.Thread(target=_commit_a_ledger_row)
        writer.start()
        writer.join()
        cursor.execute("SELECT COUNT(*) FROM testapp_ledger")
        return "READ COMMITTED" if cursor.fetchone()[0] != before else "REPEATABLE READ"

    def body() -> tuple[str, str, str]:
        broker_level = in_transaction("default", observed_level)
        with transaction.atomic(), connections["default"].cursor() as cursor:
            users_level = observed_level(cursor)
        return broker_level, users_level, _session_level()

    assert _in_thread_at("repeatable read", body) == (
        "READ COMMITTED", "REPEATABLE READ", "REPEATABLE-READ")


def _commit_a_ledger_row() -> None:
    try:
        Ledger.objects.create(label="concurrent", pid=0)
    finally:
        connections.close_all()


@pytest.mark.worker
def test_a_worker_claims_at_read_committed_and_its_tasks_keep_the_site_s_level(
        start_worker, tmp_path: Path):
    # The claim is one autocommit statement: the worker stops for good right after it
    # (tests/stall_at.py) and first reads its session's level on the claim's own connection.
    # (Watching the control connection's park in INNODB_TRX instead was flaky: a park was
    # not always listed there while it slept, once for 40 s in a CI run.)
    tasks.records_isolation.enqueue("task")
    marker = tmp_path / "claimed"
    doomed = stalling_worker(start_worker, STEPS["claim"], marker,
                             env={**REPEATABLE_READ,
                                  "MYSQLQ_TEST_STALL_QUERY": "SELECT @@session.tx_isolation"})
    kill_when_stalled(doomed, marker, "claim")
    assert marker.read_text().splitlines()[2] == "(('READ-COMMITTED',),)", marker.read_text()
    assert not Ledger.objects.exists()

    # The claim dies with its process; a worker at the same site level runs the task.
    worker = start_worker("--concurrency", "1", env=REPEATABLE_READ)
    label = wait_for(lambda: Ledger.objects.values_list("label", flat=True).first(),
                     timeout=PATIENCE, message="the task to run")
    assert label == "task:REPEATABLE-READ"
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_second_queue_database_not_at_read_committed_is_W002_too(settings):
    """The check looked at MYSQLQ['DATABASE'] only: a queue placed on another alias at
    REPEATABLE READ went unwarned."""
    queue_db = {**settings.DATABASES["default"],
                "OPTIONS": {"isolation_level": "repeatable read"}}
    settings.DATABASES = {**settings.DATABASES, "queue_b": queue_db}
    settings.MYSQLQ = {"QUEUES": {"elsewhere": {"DATABASE": "queue_b"}}}
    [warning] = check_isolation_level()
    assert warning.id == "django_mysqlq.W002" and "'queue_b'" in warning.msg
