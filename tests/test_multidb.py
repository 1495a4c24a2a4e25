"""Queues on several databases, on two real servers: the main one (alias ``default``) and
a second ``mariadbd`` on port 3407 (alias ``queues_b``) that the session starts.

The queue ``mdb_b`` lives on ``queues_b`` (``MYSQLQ['QUEUES']``), ``default`` where it
always did. What must hold: enqueue joins the transaction of the queue's own alias; one
worker process serves both; a kill -9 on the second database is recovered there; pauses
are per database; a queue naming an unknown alias is a system check error.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import transaction
from django.test import override_settings

from django_mysqlq import broker, routing
from django_mysqlq.models import Message
from tests import multidb_support as mdb
from tests.conftest import wait_for
from tests.testapp import broadcast_handlers, tasks
from tests.testapp.models import GateRun, Ledger

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"),
              pytest.mark.worker, pytest.mark.compat]

B = mdb.ALIAS_B
QUEUE_B = "mdb_b"
ON_B = {QUEUE_B: B}


@pytest.fixture(autouse=True)
def queues_on_two_servers(second_server: None, settings: Any) -> Iterator[None]:
    settings.MYSQLQ = {**settings.MYSQLQ,
                       "QUEUES": {QUEUE_B: {"DATABASE": B}}}
    yield


@pytest.fixture
def env_b() -> dict[str, str]:
    return mdb.extra_env(ON_B)


def count(alias: str, table: str, where: str = "1") -> int:
    [(found,)] = mdb.query(alias, f"SELECT COUNT(*) FROM {table} WHERE {where}")
    return int(found)


# ------------------------------------------------------------------ routing, enqueue


def test_the_second_alias_is_another_server() -> None:
    [(port_a,)] = mdb.query("default", "SELECT @@port")
    [(port_b,)] = mdb.query(B, "SELECT @@port")
    assert (port_a, port_b) == (3306, 3407)


def test_a_queue_is_placed_by_its_setting_then_a_router_then_the_default() -> None:
    class Router:
        def db_for_queue(self, queue: str) -> str | None:
            return "routed" if queue.startswith("r_") else None

        def db_for_write(self, model: object, **hints: object) -> str:
            return "primary"  # never consulted for queues

    assert routing.alias_for_queue(QUEUE_B) == B
    assert routing.alias_for_queue("other") == "default"
    with override_settings(DATABASE_ROUTERS=[Router()]):
        assert routing.alias_for_queue("r_x") == "routed"
        assert routing.alias_for_queue("other") == "default"
        with override_settings(MYSQLQ={"QUEUES": {"r_x": {"DATABASE": B}}}):
            assert routing.alias_for_queue("r_x") == B  # the setting wins
    assert routing.queue_aliases() == ("default", B)
    assert routing.QueueRouter().allow_migrate(B, "django_mysqlq") is True
    assert routing.QueueRouter().allow_migrate("elsewhere", "django_mysqlq") is False
    assert routing.QueueRouter().allow_migrate(B, "auth") is None


def test_a_queue_placed_only_by_a_router_makes_its_alias_a_queue_database(settings) -> None:
    """queue_aliases() read MYSQLQ['QUEUES'] only: with a task's queue placed on B by a
    router's db_for_queue alone, QueueRouter refused to migrate the queue tables to B
    (enqueue then failed with 1146), drain() skipped B and --database B was refused."""
    from io import StringIO

    from django.core.management import call_command

    from django_mysqlq import queue_task, testing
    from django_mysqlq.registry import registry

    class Router:
        def db_for_queue(self, queue: str) -> str | None:
            return B if queue == "mdb_routed" else None

    def routed_task(label: str) -> None: ...

    task = queue_task(queue="mdb_routed", name="tests.multidb.routed_task")(routed_task)
    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {}}
    try:
        with override_settings(DATABASE_ROUTERS=[Router()]):
            assert routing.queue_aliases() == ("default", B)
            assert routing.QueueRouter().allow_migrate(B, "django_mysqlq") is True
            task.enqueue("first")
            assert count(B, "mysqlq_message") == 1
            call_command("queuecancel", "--status", "ready", "--database", B,
                         stdout=StringIO())
            assert count(B, "mysqlq_message") == 0
            task.enqueue("second")
            assert testing.drain().succeeded == 1  # every queue database, B too
            assert count(B, "mysqlq_message") == 0
    finally:
        registry._tasks.pop("tests.multidb.routed_task", None)


def test_enqueue_joins_the_transaction_of_the_queues_own_database() -> None:
    with transaction.atomic(using=B):
        handle = tasks.record.using(queue=QUEUE_B).enqueue("rolled back")
        assert count(B, "mysqlq_message") == 1  # inside the transaction on B
        transaction.set_rollback(True, using=B)
    assert count(B, "mysqlq_message") == 0
    assert handle.database == B
    # A transaction on the other alias does not hold it back: it commits at once.
    with transaction.atomic(using="default"):
        kept = tasks.record.using(queue=QUEUE_B).enqueue("kept")
        transaction.set_rollback(True, using="default")
    assert count(B, "mysqlq_message") == 1
    assert count("default", "mysqlq_message") == 0
    assert kept.state().queue == QUEUE_B and kept.status == "ready"


def test_enqueue_many_over_two_databases_keeps_the_order_of_ids() -> None:
    calls = [tasks.echo.call(index) for index in range(6)]
    messages = [tasks.echo._new_message(call.args, call.kwargs) for call in calls]
    for index, message in enumerate(messages):
        if index % 2:
            messages[index] = type(message)(**{**message.__dict__, "queue": QUEUE_B})
    ids = broker.enqueue(messages)
    on_b = {row[0] for row in mdb.query(B, "SELECT id FROM mysqlq_message")}
    on_a = {row[0] for row in mdb.query("default", "SELECT id FROM mysqlq_message")}
    assert {ids[i] for i in (1, 3, 5)} == on_b and {ids[i] for i in (0, 2, 4)} == on_a
    queues_b = {row[0] for row in mdb.query(B, "SELECT queue FROM mysqlq_message")}
    assert queues_b == {QUEUE_B}


def test_a_queue_on_an_unknown_alias_is_a_system_check_error() -> None:
    with override_settings(MYSQLQ={"QUEUES": {"x": {"DATABASE": "nowhere"}},
                                   "READ_DATABASE": "nor_here"}):
        ids = {message.id for message in run_checks()}
        found = [message.msg for message in run_checks() if message.id == "django_mysqlq.E010"]
    assert "django_mysqlq.E010" in ids and "django_mysqlq.E011" in ids
    assert "'nowhere'" in found[0]
    with override_settings(MYSQLQ={"QUEUES": {"x": {"DATABSE": B}}}):
        assert any("unknown key(s) DATABSE" in message.msg for message in run_checks()
                   if message.id == "django_mysqlq.E001")


# ------------------------------------------------------------------ real workers


def test_one_worker_process_serves_queues_on_both_servers(start_worker, env_b) -> None:
    worker = start_worker("--queues", f"default,{QUEUE_B}", "--concurrency", "2",
                          env=env_b)
    wait_for(lambda: worker.output().count("started: queues=") == 2, timeout=30,
             message="a worker per database")
    tasks.record.enqueue_many([tasks.record.call(f"a{i}") for i in range(20)])
    tasks.record.using(queue=QUEUE_B).enqueue_many(
        [tasks.record.call(f"b{i}") for i in range(20)])
    mdb.wait_rows("default", "SELECT COUNT(*) FROM mysqlq_attempt WHERE outcome='succeeded'",
                  20)
    mdb.wait_rows(B, "SELECT COUNT(*) FROM mysqlq_attempt WHERE outcome='succeeded'", 20)
    assert Ledger.objects.count() == 40  # the tasks' own writes: on default, both times
    assert count("default", "mysqlq_message") == count(B, "mysqlq_message") == 0
    # One process, one worker row on each database, each serving its own queues.
    [(_, pid_a, queues_a)] = mdb.query("default", "SELECT id, pid, queues FROM mysqlq_worker")
    [(_, pid_b, queues_b)] = mdb.query(B, "SELECT id, pid, queues FROM mysqlq_worker")
    assert pid_a == pid_b == worker.pid
    assert (queues_a, queues_b) == ("default", QUEUE_B)
    # No queue of one database was run from the other.
    assert count(B, "mysqlq_attempt", "queue <> 'mdb_b'") == 0
    assert count("default", "mysqlq_attempt", "queue <> 'default'") == 0
    # A parked worker on B is woken by an enqueue on B (not left to its poll).
    wait_for(lambda: count(B, "mysqlq_worker", "listening") == 1, timeout=15,
             message="the worker to park on B")
    tasks.record.using(queue=QUEUE_B).enqueue("late")
    mdb.wait_rows(B, "SELECT COUNT(*) FROM mysqlq_attempt WHERE outcome='succeeded'", 21,
                  timeout=5)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert "Summary: [default] processed=20" in worker.output()  # one line per database
    assert f"Summary: [{B}] processed=21" in worker.output()
    assert count(B, "mysqlq_worker", "stopped_at IS NULL") == 0
    assert count("default", "mysqlq_worker", "stopped_at IS NULL") == 0


def test_a_child_serving_both_databases_takes_a_group_stop_as_one_stop(
        start_worker, env_b) -> None:
    """A stop sent to the whole process group, as it goes when the child's handler runs
    first: its own SIGTERM, then the supervisor's request to drain. One stop, not two
    (tests/test_supervisor_signals.py has the one-database cases)."""
    supervisor = start_worker("--processes", "1", "--queues", f"default,{QUEUE_B}",
                              env=env_b)
    wait_for(lambda: supervisor.output().count("started: queues=") == 2, timeout=30,
             message="a worker per database in the child")
    [(child,)] = mdb.query(B, "SELECT pid FROM mysqlq_worker WHERE stopped_at IS NULL")
    tasks.slow.using(queue=QUEUE_B).enqueue("both", 5)
    wait_for(lambda: Ledger.objects.filter(label="both:start").exists(), timeout=30,
             message="the task on the second database to start")
    os.kill(child, signal.SIGTERM)
    wait_for(lambda: "SIGTERM received" in supervisor.output(), timeout=30,
             message="the child to start draining")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=40) == 0, supervisor.output()
    assert "exiting now" not in supervisor.output()
    # The supervisor's summary: its children's counts, one line per database.
    assert "Summary: [default] processed=0 " in supervisor.output()
    assert f"Summary: [{B}] processed=1 succeeded=1 " in supervisor.output()
    assert Ledger.objects.filter(label="both:end").exists()
    assert count(B, "mysqlq_attempt", "outcome = 'succeeded'") == 1
    assert count(B, "mysqlq_worker", "stopped_at IS NULL") == 0


def test_broadcast_runs_once_a_process_from_the_latest_whatever_databases_it_serves(
        start_worker, env_b) -> None:
    """Topics live on MYSQLQ['DATABASE']. A process with a worker per database runs its
    broadcast subscriptions once, not once per worker; and one serving only the second
    database still runs them, from the main database's latest offset (it used to take
    its start from the second database's empty topic table: every kept message again)."""
    env = {**env_b, "MYSQLQ_TEST_EXTRA_TASK_MODULES": "tests.testapp.broadcast_handlers"}
    broadcast_handlers.flowing.publish_many([{"seq": seq} for seq in range(3)])  # before
    both = start_worker("--queues", f"default,{QUEUE_B}", env=env)
    only_b = start_worker("--queues", QUEUE_B, env=env)
    wait_for(lambda: both.output().count("started: queues=") == 2
             and "started: queues=" in only_b.output(), timeout=30,
             message="the workers to start")
    broadcast_handlers.flowing.publish_many([{"seq": seq} for seq in range(3, 6)])

    def heard(pid: int) -> list[int]:
        return sorted(GateRun.objects.filter(label="flowing/broadcast", pid=pid)
                      .values_list("seq", flat=True))

    wait_for(lambda: heard(both.pid) == heard(only_b.pid) == [3, 4, 5], timeout=30,
             message="each process to hear the three later messages")
    time.sleep(1.0)  # a second reader in the process would have read them by now
    for worker in (both, only_b):
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output()
    assert heard(both.pid) == heard(only_b.pid) == [3, 4, 5]


def test_kill_9_on_the_second_database_is_recovered_there(start_worker, env_b) -> None:
    first = start_worker("--queues", f"default,{QUEUE_B}", env=env_b)
    handle = tasks.slow_first_time.using(queue=QUEUE_B).enqueue("k9", 30)
    wait_for(lambda: Ledger.objects.filter(label="k9:start").exists(), timeout=30,
             message="the task to start on B")
    first.signal(signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    second = start_worker("--queues", QUEUE_B, env=env_b)
    mdb.wait_rows(B, "SELECT COUNT(*) FROM mysqlq_attempt WHERE outcome='succeeded'", 1,
                  timeout=40)
    outcomes = [row[0] for row in mdb.query(
        B, "SELECT outcome FROM mysqlq_attempt WHERE message_id=%s ORDER BY id", [handle.id])]
    assert outcomes == ["lost", "succeeded"]
    assert handle.state().status == "succeeded"
    assert count("default", "mysqlq_attempt") == 0  # nothing of it on the other server
    second.signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0, second.output()


def test_a_pause_holds_on_its_own_database_only(start_worker, env_b) -> None:
    broker.set_paused(QUEUE_B, True, broker.Operator("test"))
    assert broker.paused_queues(B) == {QUEUE_B}
    assert broker.paused_queues("default") == set()
    worker = start_worker("--queues", f"default,{QUEUE_B}", env=env_b)
    tasks.record.using(queue=QUEUE_B).enqueue("paused")
    tasks.record.enqueue("running")
    wait_for(lambda: Ledger.objects.filter(label="running").exists(), timeout=30,
             message="the task on default")
    time.sleep(1.5)
    assert not Ledger.objects.filter(label="paused").exists()
    broker.set_paused(QUEUE_B, False, broker.Operator("test"))
    wait_for(lambda: Ledger.objects.filter(label="paused").exists(), timeout=30,
             message="the resumed queue to run")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


# ------------------------------------------------------------------ operators, replicas


def test_queuestats_and_the_admin_see_both_databases(root) -> None:
    from io import StringIO

    from django.core.management import call_command

    tasks.record.enqueue("on a")
    on_b = tasks.record.using(queue=QUEUE_B).enqueue("on b")
    out = StringIO()
    call_command("queuestats", "--json", stdout=out)
    found = {view["database"]: {q["name"]: q["ready"] for q in view["queues"]}
             for view in __import__("json").loads(out.getvalue())["databases"]}
    assert found["default"].get("default") == 1 and found[B] == {QUEUE_B: 1}
    page = root.get("/admin/django_mysqlq/queuestate/?database=" + B).content.decode()
    assert QUEUE_B in page and 'id="databases"' in page
    listing = root.get(f"/admin/django_mysqlq/message/?database={B}").content.decode()
    assert f"/admin/django_mysqlq/message/{on_b.id}/change/" in listing
    # Cancelling from the message's page acts on its own database, never a same-id message
    # of the other one.
    # A message with the same id on the default database (ids are per database; earlier
    # tests may have moved the default's counter past B's, so make that id if it's free).
    pad = tasks.record.enqueue("pad")
    if not Message.objects.using("default").filter(pk=on_b.id).exists():
        twin = Message.objects.using("default").get(pk=pad.id)
        twin.pk = on_b.id
        twin.save(using="default", force_insert=True)
    response = root.post(f"/admin/django_mysqlq/message/{on_b.id}/act/cancel/?database={B}",
                         {"confirmed": "yes"})
    assert response.status_code == 302
    assert count(B, "mysqlq_message") == 0
    assert count(B, "mysqlq_attempt", "outcome='cancelled'") == 1
    assert count("default", "mysqlq_message", f"id={on_b.id}") == 1  # untouched


def test_reads_go_to_the_replica_and_claims_and_actions_never(start_worker, settings,
                                                              ) -> None:
    from io import StringIO

    from django.core.management import call_command

    settings.MYSQLQ = {**settings.MYSQLQ, "READ_DATABASE": {B: mdb.ALIAS_R}}
    # The replica first applies what B has (the previous test's writes and the flush
    # after it arrive asynchronously): it is stopped empty, as the checks below expect.
    mdb.wait_replicated()
    replica = mdb.raw(mdb.ALIAS_R, database=False)
    try:
        replica.cursor().execute("STOP SLAVE SQL_THREAD")
        handle = tasks.record.using(queue=QUEUE_B).enqueue("only on b")
        # On B, not on its stopped replica: the views read the replica and say why.
        out = StringIO()
        call_command("queuestats", "--database", B, stdout=out)
        text = out.getvalue()
        assert f"read from replica {mdb.ALIAS_R}: lag unknown (replication is stopped" in text
        assert QUEUE_B not in text  # nothing there yet
        # A worker with the replica configured claims on B all the same.
        worker = start_worker("--queues", QUEUE_B,
                              env=mdb.extra_env(ON_B, read={B: mdb.ALIAS_R}))
        wait_for(lambda: Ledger.objects.filter(label="only on b").exists(), timeout=30,
                 message="the message to run from B")
        assert mdb.query(mdb.ALIAS_R, "SELECT COUNT(*) FROM mysqlq_attempt") == [(0,)]
        # (A handle reads the queue's own alias.)
        wait_for(lambda: handle.state().status == "succeeded", timeout=10,
                 message="the ack on B")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output()
        # An operator action (a pause) writes B, never the replica.
        broker.set_paused(QUEUE_B, True, broker.Operator("test"))
        assert mdb.query(mdb.ALIAS_R, "SELECT COUNT(*) FROM mysqlq_queue") == [(0,)]
        assert broker.paused_queues(B) == {QUEUE_B}
    finally:
        replica.cursor().execute("START SLAVE SQL_THREAD")
        replica.close()
    mdb.wait_replicated()
    [view] = __import__("django_mysqlq.views", fromlist=["views"]).dashboards(only=B)
    assert view.read == mdb.ALIAS_R and view.lag is not None and view.lag.seconds is not None
    assert [q.name for q in view.dashboard.queues if q.paused] == [QUEUE_B]
    broker.set_paused(QUEUE_B, False, broker.Operator("test"))


def test_queuestats_refuses_an_alias_that_holds_no_queue() -> None:
    """The replica's alias is a database of this project, but no queue lives there: it is
    refused as such, never shown as a queue database (nor advised to be migrated)."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=f"holds no queue .*{B}"):
        call_command("queuestats", "--database", mdb.ALIAS_R)


def test_replica_lag_is_unknown_and_said_so_on_a_server_that_replicates_nothing() -> None:
    from django_mysqlq.broker.replica import replica_lag

    lag = replica_lag(B)
    assert lag.seconds is None and "not a replica" in lag.problem


def test_the_operator_commands_act_on_the_database_they_are_given() -> None:
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    tasks.record.enqueue("stays on a")
    tasks.record.using(queue=QUEUE_B).enqueue("cancelled on b")
    call_command("queuecancel", "--status", "ready", "--database", B, stdout=StringIO())
    assert count(B, "mysqlq_message") == 0
    assert count("default", "mysqlq_message") == 1
    with pytest.raises(CommandError, match="holds no queue"):
        call_command("queuecancel", "--status", "ready", "--database", "nowhere")


def test_an_operator_command_given_a_queue_acts_on_that_queues_database(
        monkeypatch) -> None:
    """--queue without --database acted on MYSQLQ['DATABASE'] even when the queue lives on
    B: queuecancel/queuerequeue changed nothing there and queuesubject showed nothing."""
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    from django_mysqlq import ops

    tasks.record.enqueue("stays on a")
    tasks.record.using(queue=QUEUE_B).enqueue("cancelled on b")
    call_command("queuecancel", "--status", "ready", "--queue", QUEUE_B, stdout=StringIO())
    assert count(B, "mysqlq_message") == 0
    assert count("default", "mysqlq_message") == 1
    dead = tasks.record.using(queue=QUEUE_B).enqueue("dead on b")
    mdb.query(B, "UPDATE mysqlq_message SET status = 'dead' WHERE id = %s", [dead.id])
    out = StringIO()
    call_command("queuerequeue", "--queue", QUEUE_B, stdout=out)
    assert out.getvalue() == "Requeued 1 message(s).\n"
    assert count(B, "mysqlq_message", "status = 'ready'") == 1
    seen: list[str] = []
    real = ops.subject_state

    def recording(queue: str, key: str, *, ordered: bool = True) -> ops.SubjectState:
        seen.append(broker.default_alias())
        return real(queue, key, ordered=ordered)

    monkeypatch.setattr(ops, "subject_state", recording)
    call_command("queuesubject", "show", "k", "--queue", QUEUE_B, stdout=StringIO())
    assert seen == [B]
    # A --database the queue does not live on is refused, not acted on.
    for command in (["queuecancel", "--status", "ready"], ["queuerequeue"],
                    ["queuesubject", "show", "k"]):
        with pytest.raises(CommandError, match=rf"'{QUEUE_B}' lives on the database "
                                               rf"'{B}', not 'default'"):
            call_command(*command, "--queue", QUEUE_B, "--database", "default")
    with pytest.raises(CommandError, match=r"on several databases"):
        call_command("queuecancel", "--status", "ready", "--queue", f"default,{QUEUE_B}")
    assert count(B, "mysqlq_message") == 1 and count("default", "mysqlq_message") == 1


def test_max_tasks_counts_for_the_whole_process_over_both_databases(start_worker,
                                                                    env_b) -> None:
    tasks.record.enqueue_many([tasks.record.call(f"a{i}") for i in range(10)])
    tasks.record.using(queue=QUEUE_B).enqueue_many(
        [tasks.record.call(f"b{i}") for i in range(10)])
    worker = start_worker("--queues", f"default,{QUEUE_B}", "--max-tasks", "7",
                          "--concurrency", "2", env=env_b)
    assert worker.wait(timeout=60) == 0, worker.output()
    done = count("default", "mysqlq_attempt") + count(B, "mysqlq_attempt")
    assert done == 7, worker.output()  # per process, not 7 per database
    assert count("default", "mysqlq_message") + count(B, "mysqlq_message") == 13



def test_queuepause_pauses_a_queue_on_its_own_database_and_lists_it() -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("queuepause", QUEUE_B, "default", stdout=out)
    try:
        assert broker.paused_queues(B) == {QUEUE_B}
        assert broker.paused_queues("default") == {"default"}
        assert out.getvalue().splitlines()[-1] == f"Paused now: default, {QUEUE_B}."
    finally:
        call_command("queuepause", "--resume", QUEUE_B, "default", stdout=out)
    assert out.getvalue().splitlines()[-1] == "Paused now: none."


def test_max_memory_past_on_one_database_recycles_the_whole_process(start_worker,
                                                                   env_b) -> None:
    """The worker of the database with work goes past --max-memory and drains; the one
    of the idle database never runs anything, so never judged its memory: the process
    lived on (and no longer served the first database) instead of being replaced."""
    tasks.record.enqueue_many([tasks.record.call(f"a{i}") for i in range(3)])
    worker = start_worker("--queues", f"default,{QUEUE_B}", "--max-memory", "1",
                          "--batch", "1", env=env_b)
    assert worker.wait(timeout=60) == 0, worker.output()
    assert "over --max-memory 1" in worker.output()


def test_a_publish_from_a_thread_serving_the_second_database_goes_to_the_topics_database(
        ) -> None:
    """A task of a queue on B runs on a thread bound to B: its publish went into B's
    topic tables, which no pump or broadcast reader reads (topics live on the default)."""
    from django_mysqlq import Topic

    with routing.on_alias(B):
        Topic("mdb_orders").publish({"from": "a task on b"})
    assert count("default", "mysqlq_topic_message", "topic = 'mdb_orders'") == 1
    assert count(B, "mysqlq_topic_message", "topic = 'mdb_orders'") == 0


def test_a_router_that_moves_a_group_queue_elsewhere_stops_the_worker_saying_so() -> None:
    """E012 sees MYSQLQ['QUEUES'] only: a router sending group:<name> to another database
    made a worker pump that database's empty topic tables while publishers wrote to the
    default one; the group got nothing, silently."""
    from django_mysqlq.exceptions import WorkerCannotRun
    from django_mysqlq.worker import databases
    from django_mysqlq.worker.options import WorkerOptions

    class Router:
        def db_for_queue(self, queue: str) -> str | None:
            return B

    with override_settings(DATABASE_ROUTERS=[Router()]):
        with pytest.raises(WorkerCannotRun, match=r"group:billing are placed on") as caught:
            databases.split(WorkerOptions.build(["default", "group:billing"]))
        assert caught.value.exit_status == 78
        assert [o.database for o in databases.split(WorkerOptions.build(["default"]))] == [B]


def test_testing_drain_runs_the_messages_of_a_queue_on_the_second_database() -> None:
    """drain() claimed on MYSQLQ['DATABASE'] only: drain([queue on B]) ran nothing and
    said nothing while the message sat on B."""
    from django_mysqlq import testing

    tasks.record.using(queue=QUEUE_B).enqueue("on-b")
    tasks.record.enqueue("on-default")
    assert testing.drain([QUEUE_B]).succeeded == 1
    assert count(B, "mysqlq_message") == 0 and count("default", "mysqlq_message") == 1
    assert testing.drain().succeeded == 1  # every queue database by default
    assert count("default", "mysqlq_message") == 0


def test_the_test_mode_runs_an_atomic_task_in_a_transaction_on_its_queues_database(
        monkeypatch) -> None:
    """Immediate mode opened an atomic=True task's transaction on MYSQLQ['DATABASE']
    whatever its queue: a task of a queue on B kept its writes there after failing."""
    from django_mysqlq import immediate as immediate_mode
    from django_mysqlq import testing

    used: list[str | None] = []
    real_atomic = transaction.atomic

    def recording_atomic(using=None, savepoint=True, durable=False):
        used.append(using)
        return real_atomic(using=using, savepoint=savepoint, durable=durable)

    monkeypatch.setattr(immediate_mode.transaction, "atomic", recording_atomic)
    with testing.immediate():
        tasks.atomic_record.using(queue=QUEUE_B).enqueue("immediate-on-b")
    assert B in used, used
