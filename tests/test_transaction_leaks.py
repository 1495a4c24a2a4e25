"""Transactions a task leaves open with raw SQL, behind Django's back.

Django's own state (``in_atomic_block``, ``autocommit``) can't see a ``START TRANSACTION``
or ``SET autocommit = 0`` sent through a cursor: only the server knows. Left alone, every
later task on that thread writes into the open transaction and, with persistent
connections, none of it is ever committed; with ``ACK_BATCH_SIZE=1`` the ack's own
``START TRANSACTION`` commits the leak instead. The worker must ask the server after each
task, fail the leaking attempt with ``TransactionLeftOpen``, and hand the next task a
clean connection.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_mysqlq import broker
from django_mysqlq.models import Message
from tests.burst import assert_dead, assert_succeeded, enqueue_good, run_burst
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

LEFT_OPEN = "django_mysqlq.exceptions.TransactionLeftOpen"
#: Worker environments: persistent or per-task connections, batched or immediate acks.
SETUPS = {
    "persistent-batched": {"MYSQLQ_TEST_CONN_MAX_AGE": "none", "MYSQLQ_TEST_ACK_BATCH": "20"},
    "persistent-ack1": {"MYSQLQ_TEST_CONN_MAX_AGE": "none", "MYSQLQ_TEST_ACK_BATCH": "1"},
    "per-task-batched": {"MYSQLQ_TEST_CONN_MAX_AGE": "0", "MYSQLQ_TEST_ACK_BATCH": "20"},
    "per-task-ack1": {"MYSQLQ_TEST_CONN_MAX_AGE": "0", "MYSQLQ_TEST_ACK_BATCH": "1"},
}


def labels() -> list[str]:
    return sorted(Ledger.objects.values_list("label", flat=True))


@pytest.mark.worker
@pytest.mark.parametrize("setup", SETUPS)
def test_a_raw_transaction_left_open_fails_its_task_and_swallows_nothing(start_worker, setup):
    before = enqueue_good("before")
    leaky = tasks.leaves_raw_transaction_open.enqueue("leaked")
    after = [enqueue_good(f"after{i}") for i in range(10)]
    counts, _ = run_burst(start_worker, "--concurrency", "1", env=SETUPS[setup])
    assert_succeeded(before, *after)
    message = assert_dead(leaky.id, ["retried", "failed"], LEFT_OPEN)
    assert "rolled back" in message.last_error
    # Every later task's write is committed; the leaking task's write never is.
    assert labels() == sorted(["before", *(f"after{i}" for i in range(10))])
    assert counts["succeeded"] == 11


@pytest.mark.worker
@pytest.mark.parametrize("setup", ["persistent-batched", "per-task-ack1"])
def test_autocommit_turned_off_with_raw_sql_is_a_leak_too(start_worker, setup):
    leaky = tasks.turns_autocommit_off_raw.enqueue("autocommit-off")
    after = [enqueue_good(f"after{i}") for i in range(5)]
    run_burst(start_worker, "--concurrency", "1", env=SETUPS[setup])
    assert_succeeded(*after)
    assert_dead(leaky.id, ["retried", "failed"], LEFT_OPEN)
    assert labels() == [f"after{i}" for i in range(5)]


@pytest.mark.worker
@pytest.mark.parametrize("setup", ["persistent-batched", "persistent-ack1"])
def test_a_failure_inside_a_raw_transaction_commits_none_of_it(start_worker, setup):
    """Recording the failure opens a transaction: it must not commit the task's half-work."""
    failing = tasks.raw_transaction_then_raises.enqueue("half-done")
    after = [enqueue_good(f"after{i}") for i in range(3)]
    run_burst(start_worker, "--concurrency", "1", env=SETUPS[setup])
    assert_succeeded(*after)
    assert_dead(failing.id, ["retried", "failed"], "builtins.ValueError")
    assert labels() == ["after0", "after1", "after2"]


@pytest.mark.worker
@pytest.mark.parametrize("how", ["cursor", "begin", "autocommit", "send_query"])
def test_a_leak_through_the_driver_itself_is_caught(start_worker, how):
    """Past Django entirely (the ``MySQLdb`` connection's cursor, ``begin()``,
    ``autocommit(False)``, ``send_query``): the check still sees it, though it skips the
    round trip for tasks that sent nothing."""
    before = enqueue_good("before")
    leaky = tasks.leaks_through_the_driver.enqueue(f"leaked-{how}", how)
    after = [enqueue_good(f"after{i}") for i in range(5)]
    run_burst(start_worker, "--concurrency", "1", env=SETUPS["persistent-batched"])
    assert_succeeded(before, *after)
    assert_dead(leaky.id, ["retried", "failed"], LEFT_OPEN)
    assert labels() == sorted(["before", *(f"after{i}" for i in range(5))])


def test_a_connection_sent_nothing_since_its_mark_is_answered_without_a_round_trip():
    connection.ensure_connection()
    marks = broker.activity_marks()
    sent, count = marks[connection.alias]
    assert broker.transaction_left_open(connection.alias, since=marks[connection.alias]) is False
    assert sent.count == count  # answered from the mark: no statement went out
    connection.connection.autocommit(False)  # no query(): the client status shows it
    try:
        assert broker.transaction_left_open(connection.alias,
                                            since=marks[connection.alias]) is True
    finally:
        connection.connection.autocommit(True)
    marks = broker.activity_marks()
    with connection.cursor() as cursor:
        cursor.execute("START TRANSACTION")
    try:
        # A statement since the mark: the server is asked, and it knows.
        assert broker.transaction_left_open(connection.alias,
                                            since=marks[connection.alias]) is True
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ROLLBACK")
    assert broker.transaction_left_open(connection.alias,
                                        since=marks[connection.alias]) is False


def test_the_server_side_check_sees_raw_transactions_on_both_vendors_paths():
    """MariaDB answers ``@@in_transaction``; MySQL's path is forced here on MariaDB."""
    connection.ensure_connection()
    for vendor_path in ("mariadb", "mysql"):
        assert broker.transaction_left_open(connection.alias, via=vendor_path) is False
        with connection.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            cursor.execute("SELECT COUNT(*) FROM mysqlq_message")
        assert broker.transaction_left_open(connection.alias, via=vendor_path) is True
        with connection.cursor() as cursor:
            cursor.execute("ROLLBACK")
        with connection.cursor() as cursor:
            cursor.execute("SET autocommit = 0")
        assert broker.transaction_left_open(connection.alias, via=vendor_path) is True
        with connection.cursor() as cursor:
            cursor.execute("SET autocommit = 1")
    assert Message.objects.count() == 0
