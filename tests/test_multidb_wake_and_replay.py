"""Two paths of queues on two servers (tests/multidb_support.py) that need a worker or an
operator on the second one: a wake-up refused there (the producer's database user may
not ``KILL`` the worker's connection) turns wake-ups off on that alias only; and a
history row of a queue on the second server replays there, with its link, from
``broker.replay`` (through ``ops.replay``, bound to the alias as the admin binds it) and
from the history page's "Replay" button."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections

from django_mysqlq import broker, ops, routing
from django_mysqlq.broker import park
from django_mysqlq.messages import AttemptResult
from django_mysqlq.models import Attempt, Message
from tests import multidb_support as mdb
from tests.conftest import wait_for
from tests.operator_support import RUNNER, claim_only
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__")]

B = mdb.ALIAS_B
QUEUE_B = "mdb_b"
WEAK = "mysqlq_nokill"
#: Parks grow to 8 s: a worker left unwoken runs a new message only at its park's end.
SLOW_PARKS = {"MYSQLQ_TEST_HEARTBEAT": "8", "MYSQLQ_TEST_LEASE": "30",
              "MYSQLQ_TEST_RECOVERY": "8"}


@pytest.fixture(autouse=True)
def queues_on_two_servers(second_server: None, settings: Any) -> Iterator[None]:
    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {QUEUE_B: {"DATABASE": B}}}
    for table in ("message", "attempt", "worker"):
        mdb.query(B, f"DELETE FROM mysqlq_{table}")  # B is not flushed between tests
    yield


def count(alias: str, table: str, where: str = "1") -> int:
    [(found,)] = mdb.query(alias, f"SELECT COUNT(*) FROM {table} WHERE {where}")
    return int(found)


# ------------------------------------------------------------------ a refused KILL


@pytest.fixture
def producer_without_kill_on_b() -> Iterator[None]:
    """This process's connection to B logs in as a user that may use the queue's tables
    but not KILL another user's connections (no CONNECTION ADMIN, no PROCESS)."""
    admin = mdb.raw(B, database=False)
    cursor = admin.cursor()
    cursor.execute(f"DROP USER IF EXISTS '{WEAK}'@'127.0.0.1'")
    cursor.execute(f"CREATE USER '{WEAK}'@'127.0.0.1' IDENTIFIED BY 'pw'")
    cursor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{mdb.DATABASE}`.* "
                   f"TO '{WEAK}'@'127.0.0.1'")
    connection = connections[B]
    saved = {key: connection.settings_dict.get(key) for key in ("USER", "PASSWORD")}
    connection.close()
    connection.settings_dict.update(USER=WEAK, PASSWORD="pw")
    park._wake_state.quiet_since.clear()
    park._wake_state.disabled.clear()
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.update(saved)
        park._wake_state.quiet_since.clear()
        park._wake_state.disabled.clear()
        cursor.execute(f"DROP USER IF EXISTS '{WEAK}'@'127.0.0.1'")
        admin.close()


def parked_on(alias: str) -> bool:
    return count(alias, "mysqlq_worker", "listening AND stopped_at IS NULL") == 1


def test_a_refused_kill_turns_wake_ups_off_on_that_database_only(
        start_worker, producer_without_kill_on_b, caplog) -> None:
    worker = start_worker("--queues", f"default,{QUEUE_B}",
                          env={**mdb.extra_env({QUEUE_B: B}), **SLOW_PARKS})
    wait_for(lambda: parked_on("default") and parked_on(B), timeout=30,
             message="the worker to park on both databases")
    assert mdb.query(B, "SELECT CURRENT_USER()")[0][0] == f"{WEAK}@127.0.0.1"
    time.sleep(1.5)  # their parks have grown past a second
    caplog.set_level(logging.WARNING, logger="django_mysqlq")

    on_b = tasks.record.using(queue=QUEUE_B).enqueue("refused")  # its wake-up: KILL refused
    assert park._wake_state.disabled == {B}
    [warning] = [r.getMessage() for r in caplog.records if "Can't wake" in r.getMessage()]
    assert f"on database {B}" in warning and "not owner of thread" in warning
    assert broker.wake([QUEUE_B], B) == 0  # off there: no KILL tried again

    # The default database keeps its wake-ups: its KILL QUERY is sent and accepted (wake()
    # counts a listener only then), and the woken worker runs the message.
    wait_for(lambda: parked_on("default"), timeout=15, message="the worker parked on default")
    park._wake_state.quiet_since.clear()
    assert broker.wake(["default"], "default") == 1
    tasks.record.enqueue("woken")
    wait_for(lambda: Ledger.objects.filter(label="woken").exists(), timeout=30,
             message="the message on default")
    assert park._wake_state.disabled == {B}
    assert len([r for r in caplog.records if "Can't wake" in r.getMessage()]) == 1

    # B's worker polls instead: the message runs at the end of a park, not lost.
    mdb.wait_rows(B, f"SELECT COUNT(*) FROM mysqlq_attempt WHERE message_id={on_b.id} "
                  "AND outcome='succeeded'", 1, timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


# ------------------------------------------------------------------ replay on B


def failed_on_b(label: str) -> tuple[int, int]:
    """A message on B that failed for good: (its id, its final history row on B)."""
    handle = tasks.always_fails.using(queue=QUEUE_B).enqueue(label)
    with routing.on_alias(B):
        message = claim_only(handle.id, QUEUE_B)
        broker.fail(message, RUNNER, AttemptResult(
            started_at=broker.database_now(), error_class="ValueError",
            error_message=f"boom {label}", traceback="Traceback ..."), retry=False)
    [(row,)] = mdb.query(B, "SELECT id FROM mysqlq_attempt WHERE message_id=%s "
                         "AND outcome='failed'", [handle.id])
    return handle.id, int(row)


def copy_of(original: int, row: int, alias: str = B) -> tuple[int, str]:
    """The copy a replay of history row ``row`` made on ``alias`` and its 'replayed'
    history row's note (both there)."""
    [(copy_id, note)] = mdb.query(
        alias, "SELECT message_id, error_message FROM mysqlq_attempt "
        "WHERE outcome='replayed' AND error_message LIKE %s", [f"%(history row {row})"])
    assert note.startswith(f"replayed from #{original}")
    return int(copy_id), str(note)


def test_broker_replay_of_history_on_the_second_server_enqueues_there() -> None:
    original, row = failed_on_b("replay me")
    before_default = count("default", "mysqlq_message")
    with routing.on_alias(B):
        new_id = ops.replay(row, broker.Operator("test"))
    copy_id, note = copy_of(original, row)
    assert copy_id == new_id
    [(queue, task, payload, status)] = mdb.query(
        B, "SELECT queue, task_name, payload, status FROM mysqlq_message WHERE id=%s",
        [new_id])
    assert (queue, task, status) == (QUEUE_B, tasks.always_fails.name, "ready")
    assert "replay me" in payload
    assert note == f"replayed from #{original} (history row {row})"
    # Linked as the pipeline's copies are: its replay on B skips this original.
    assert mdb.query(B, "SELECT replayed_from FROM mysqlq_attempt WHERE message_id=%s "
                     "AND outcome='replayed'", [new_id]) == [(original,)]
    assert count("default", "mysqlq_message") == before_default  # nothing on default
    assert count("default", "mysqlq_attempt", "outcome='replayed'") == 0


def test_history_of_a_queue_that_moved_replays_to_its_database_now() -> None:
    """A row on default of a queue that now lives on B: the copy goes to B (where
    enqueue() puts that queue's messages), its 'replayed' row with it."""
    made = Attempt.objects.using("default").create(
        message_id=777_777, queue=QUEUE_B, task_name=tasks.record.name, attempt=1,
        outcome="failed", priority=0, enqueued_at=broker.database_now(),
        finished_at=broker.database_now(), worker_id="w",
        payload='{"args": ["moved"], "kwargs": {}}')
    new_id = ops.replay(made.pk, broker.Operator("test"))
    _, note = copy_of(777_777, made.pk)
    assert note == f"replayed from #777777 on database default (history row {made.pk})"
    # Not linked: #777777 is a message of default, not of B.
    assert mdb.query(B, "SELECT replayed_from FROM mysqlq_attempt WHERE message_id=%s "
                     "AND outcome='replayed'", [new_id]) == [(None,)]
    assert mdb.query(B, "SELECT queue FROM mysqlq_message WHERE id=%s", [new_id]) == [
        (QUEUE_B,)]
    assert not Message.objects.using("default").filter(queue=QUEUE_B).exists()


def test_the_history_page_s_replay_button_replays_on_the_page_s_database(root) -> None:
    original, row = failed_on_b("from the page")
    # A history row with the same id on default: the button must not replay that one.
    twin = Attempt.objects.using("default").create(
        message_id=888_888, queue="default", task_name=tasks.record.name, attempt=1,
        outcome="failed", priority=0, enqueued_at=broker.database_now(),
        finished_at=broker.database_now(), worker_id="w",
        payload='{"args": ["twin"], "kwargs": {}}')
    Attempt.objects.using("default").filter(pk=twin.pk).update(id=row)
    page = root.get(f"/admin/django_mysqlq/attempt/{row}/change/?database={B}")
    assert page.status_code == 200
    action = f"/admin/django_mysqlq/attempt/{row}/replay/?database={B}"
    assert f'action="{action}"' in page.content.decode()
    done = root.post(action)
    copy_id, _ = copy_of(original, row)
    assert done.status_code == 302
    assert done["Location"] == f"/admin/django_mysqlq/message/{copy_id}/change/?database={B}"
    assert not Message.objects.using("default").exists()  # the twin was not replayed
    shown = root.get(done["Location"])
    assert shown.status_code == 200 and "from the page" in shown.content.decode()
