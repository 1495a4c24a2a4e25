"""The queue on a 3-node MariaDB Galera cluster: producers and workers on different nodes.

On a cluster, connection ids, the process list, ``KILL`` and ``GET_LOCK`` are per node,
while the tables are shared. These tests put each party on its own node and check what
the queue promises there: a live claim is never taken by a sweeper on another node, one
recovery leader for the whole cluster, wake-ups that reach a worker parked on another
node (and never a stranger's statement), certification conflicts retried whole and
counted, and, with real worker processes, every message run, a kill -9 of a worker
recovered by a peer on another node within the lease, and no message lost when a database
node is killed mid-stream.

The cluster (``bench/cluster/galera.sh``) is started once per session and left running.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_mysqlq import broker
from django_mysqlq.broker import park, settle
from tests import galera_support as galera
from tests.conftest import WorkerProcess, WorkerStarter, wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.galera, pytest.mark.worker]


@pytest.fixture(scope="session")
def galera_cluster() -> None:
    galera.start()


@pytest.fixture(autouse=True)
def on_the_cluster(galera_cluster: None, django_db_blocker: Any) -> Iterator[None]:
    """Every test here talks to the cluster (never the test database): clean tables, and
    producer state that remembers nothing of another test."""
    with django_db_blocker.unblock():
        galera.empty_tables()
        park._wake_state.quiet_since.clear()
        park._wake_state.disabled.clear()
        yield


class NodeThread:
    """A thread with a connection of its own to one node, running the calls it is given
    (a worker's control thread, say), so its connection lives between calls."""

    def __init__(self, node: int) -> None:
        self.node = node
        self._calls: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]] | None] = \
            queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with galera.on_node(self.node):
            while (item := self._calls.get()) is not None:
                call, answer = item
                try:
                    answer.put((True, call()))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    answer.put((False, exc))

    def submit(self, call: Callable[[], Any]) -> queue.Queue[Any]:
        answer: queue.Queue[Any] = queue.Queue()
        self._calls.put((call, answer))
        return answer

    def call(self, call: Callable[[], Any], timeout: float = 30.0) -> Any:
        return result(self.submit(call), timeout)

    def close(self) -> None:
        self._calls.put(None)
        self._thread.join(30)


def result(answer: queue.Queue[Any], timeout: float) -> Any:
    ok, value = answer.get(timeout=timeout)
    if not ok:
        raise value
    return value


@contextlib.contextmanager
def node_threads(*nodes: int) -> Iterator[list[NodeThread]]:
    threads = [NodeThread(node) for node in nodes]
    try:
        yield threads
    finally:
        for thread in threads:
            thread.close()


def gcomm_uuid(node: int) -> str:
    [(_, value)] = galera.query(node, "SHOW STATUS LIKE 'wsrep_gcomm_uuid'")
    return str(value)


def seen_on(node: int, sql: str, params: Any = None) -> Any:
    """Wait until ``node`` has applied what makes ``sql`` return a row; return it."""
    return wait_for(lambda: galera.query(node, sql, params), timeout=10,
                    message=f"node {node} to see {sql}")


# --------------------------------------------------------------------------- liveness


def test_a_claim_is_never_taken_by_a_sweep_on_another_node_while_its_lease_holds():
    with galera.on_node(1):
        message_id = tasks.record.enqueue("held").id
    with node_threads(2, 3) as (claimer, sweeper):
        claimed = claimer.call(lambda: broker.claim(["default"], 1, "w-node2", 30.0))
        assert [m.id for m in claimed] == [message_id]
        seen_on(3, "SELECT 1 FROM mysqlq_message WHERE id = %s AND status = 'claimed'",
                [message_id])
        # The claiming connection lives on node 2; node 3's process list can't show it.
        assert sweeper.call(broker.recover) == []
        assert sweeper.call(lambda: broker.connection_session().cluster)
        [(owner, owner_start)] = galera.query(
            3, "SELECT owner_connection, owner_server_start FROM mysqlq_message WHERE id = %s",
            [message_id])
        assert (owner, owner_start) == (None, None)  # judged by its lease alone


def test_an_expired_lease_is_recovered_from_another_node():
    with galera.on_node(1):
        message_id = tasks.record.enqueue("expired").id
    with node_threads(2, 3) as (claimer, sweeper):
        claimer.call(lambda: broker.claim(["default"], 1, "w-node2", 0.5))
        seen_on(3, "SELECT 1 FROM mysqlq_message WHERE id = %s AND status = 'claimed'",
                [message_id])
        time.sleep(0.6)
        assert sweeper.call(broker.recover) == [message_id]
    [(outcome, error)] = galera.query(
        1, "SELECT outcome, error_message FROM mysqlq_attempt WHERE message_id = %s",
        [message_id])
    assert outcome == "lost" and "lease expired" in error


def test_one_recovery_leader_for_the_whole_cluster_and_a_successor_after_its_lease(settings):
    settings.MYSQLQ = {**settings.MYSQLQ, "LEASE_SECONDS": 2.0, "HEARTBEAT_SECONDS": 1.0}
    with node_threads(1, 2) as (first, second):
        assert first.call(lambda: broker.recover(keep_lock=True)) == []
        assert first.call(broker.is_recovery_leader)
        # GET_LOCK would have given node 2 a leader of its own.
        assert second.call(lambda: broker.recover(keep_lock=True)) == []
        assert not second.call(broker.is_recovery_leader)
        first.close()  # the leader stops sweeping: its lease lapses

        def second_leads() -> bool:
            second.call(lambda: broker.recover(keep_lock=True))
            return bool(second.call(broker.is_recovery_leader))

        wait_for(second_leads, timeout=15, interval=0.2, message="a new leader on node 2")
    assert galera.query(1, "SELECT COUNT(*) FROM mysqlq_lease") == [(1,)]


# --------------------------------------------------------------------------- wake-ups


def test_a_wake_up_reaches_a_worker_parked_on_another_node():
    with node_threads(2) as (parked,):
        parked.call(lambda: broker.register_worker("w-node2", "host", 1, ["default"], 1))
        parked.call(lambda: broker.listen("w-node2", True))
        node2 = gcomm_uuid(2)
        seen_on(1, "SELECT 1 FROM mysqlq_worker WHERE id = 'w-node2' AND listening = 1 "
                   "AND node = %s", [node2])
        park_ended = parked.submit(
            lambda: broker.idle_wait(["default"], 20.0, worker_id="w-node2"))
        time.sleep(0.5)  # let it reach its SLEEP
        with galera.on_node(1):
            tasks.record.enqueue("wake")
        # Before: KILL QUERY of node 2's connection id on node 1, and a park that slept on.
        state, _ = result(park_ended, timeout=10)
    assert state in ("woken", "ready")


def test_a_producer_never_kills_a_statement_of_a_connection_on_another_node():
    """A listener parked on node 2 with connection id N: on node 1, N is someone else."""
    with galera.raw(1) as stranger:
        cursor = stranger.cursor()
        cursor.execute("SELECT CONNECTION_ID()")
        [(stranger_id,)] = cursor.fetchall()
        galera.query(1, "INSERT INTO mysqlq_worker (id, host, pid, queues, concurrency, "
                        "connection_id, started_at, last_heartbeat, listening, node, "
                        "processed, failed) VALUES ('ghost', 'h', 1, 'default', 1, %s, "
                        "UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 1, %s, 0, 0)",
                     [stranger_id, gcomm_uuid(2)])
        slept: list[Any] = []
        sleeper = threading.Thread(target=lambda: (cursor.execute("SELECT SLEEP(2)"),
                                                   slept.extend(cursor.fetchall())))
        sleeper.start()
        time.sleep(0.3)
        with galera.on_node(1):
            assert broker.wake(["default"]) == 1
        sleeper.join(10)
    assert slept == [(0,)]  # slept its full time: no KILL QUERY reached it
    assert galera.query(1, "SELECT listening FROM mysqlq_worker WHERE id = 'ghost'") == [(0,)]


# --------------------------------------------------------------------------- conflicts


def test_a_certification_conflict_at_commit_is_retried_whole_and_counted(monkeypatch):
    with galera.on_node(1):
        message_id = tasks.record.enqueue("conflict").id
    original = settle._AckAttempt.run
    runs: list[int] = []

    def run_then_conflict(self: Any, cursor: Any) -> Any:
        owned = original(self, cursor)
        runs.append(1)
        if len(runs) == 1:  # node 1 commits a change to the same row before our COMMIT
            galera.query(1, "UPDATE mysqlq_message SET priority = priority + 1 "
                            "WHERE id = %s", [message_id])
        return owned

    monkeypatch.setattr(settle._AckAttempt, "run", run_then_conflict)
    before = broker.stats.deadlocks
    with node_threads(2) as (acker,):
        [message] = acker.call(lambda: broker.claim(["default"], 1, "w-node2", 30.0))
        runner = broker.Runner(worker_id="w-node2", host="h", pid=1, thread="t")
        done = acker.call(lambda: broker.ack_many(
            [(message, runner, broker.AttemptResult(started_at=broker.database_now()))]))
    assert done == {message_id}
    assert len(runs) == 2  # the whole transaction ran again after the failed COMMIT
    assert broker.stats.deadlocks > before
    seen_on(1, "SELECT 1 FROM mysqlq_attempt WHERE message_id = %s", [message_id])
    assert galera.query(1, "SELECT outcome FROM mysqlq_attempt WHERE message_id = %s",
                        [message_id]) == [("succeeded",)]
    assert galera.query(1, "SELECT COUNT(*) FROM mysqlq_message") == [(0,)]


# --------------------------------------------------------------------------- real workers

#: Worker settings for these tests: a short lease, so a crash is recovered in seconds.
LEASE = 3.0


@pytest.fixture
def node_worker(request: pytest.FixtureRequest) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``runqueueworker`` subprocesses connected to a node; killed at teardown."""
    starter = WorkerStarter(request, {})

    def start(node: int, *args: str) -> WorkerProcess:
        env = galera.node_env(node)
        env.update({"MYSQLQ_TEST_LEASE": str(LEASE), "MYSQLQ_TEST_HEARTBEAT": "1"})
        return starter.start(*args, env=env, label=f"-node{node}")

    yield start
    starter.kill_all()


def registered(count: int) -> None:
    wait_for(lambda: galera.query(1, "SELECT COUNT(*) FROM mysqlq_worker "
                                     "WHERE stopped_at IS NULL")[0][0] >= count,
             timeout=30, message=f"{count} workers registered")


def ledger(node: int = 1) -> list[tuple[str, int]]:
    return [(str(label), int(pid)) for label, pid in
            galera.query(node, "SELECT label, pid FROM testapp_ledger ORDER BY id")]


def test_producers_on_one_node_and_workers_on_two_others_run_every_message_once(node_worker):
    workers = [node_worker(2, "--concurrency", "2"), node_worker(3, "--concurrency", "2")]
    registered(2)
    labels = [f"m{i}" for i in range(60)]
    with galera.on_node(1):
        for label in labels:
            tasks.record.enqueue(label)
            time.sleep(0.01)
    wait_for(lambda: len(ledger()) >= len(labels), timeout=60, message="every message run")
    runs = ledger()
    assert sorted(label for label, _ in runs) == sorted(labels)
    assert {pid for _, pid in runs} == {w.pid for w in workers}  # both nodes worked
    wait_for(lambda: galera.query(1, "SELECT COUNT(*) FROM mysqlq_message") == [(0,)],
             timeout=30, message="every message acked")
    assert galera.query(1, "SELECT outcome, COUNT(*) FROM mysqlq_attempt GROUP BY outcome") \
        == [("succeeded", len(labels))]
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()
        assert "node of a Galera cluster" in worker.output()


def test_kill_9_of_a_worker_is_recovered_by_a_peer_on_another_node_within_its_lease(
        node_worker):
    doomed = node_worker(2, "--concurrency", "2", "--batch", "2")
    registered(1)
    with galera.on_node(1):
        for label in ("a", "b"):
            tasks.slow_first_time.enqueue(label, 60.0)
    wait_for(lambda: {label for label, pid in ledger() if pid == doomed.pid}
             >= {"a:start", "b:start"}, timeout=20, message="both started on node 2")
    peer = node_worker(3, "--concurrency", "2")
    registered(2)
    doomed.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: {label for label, pid in ledger() if pid == peer.pid}
             >= {"a:end", "b:end"}, timeout=30, message="the peer on node 3 ran both")
    recovered_in = time.monotonic() - killed_at
    print(f"kill -9 to both re-run on another node: {recovered_in:.2f}s (lease {LEASE}s)")
    lost = galera.query(1, "SELECT error_message FROM mysqlq_attempt WHERE outcome = 'lost'")
    assert len(lost) == 2 and all("lease expired" in row[0] for row in lost)
    wait_for(lambda: galera.query(1, "SELECT COUNT(*) FROM mysqlq_message") == [(0,)],
             timeout=30, message="the re-runs acked")


def test_kill_9_of_a_database_node_while_producing_and_consuming_loses_nothing(node_worker):
    workers = [node_worker(2, "--concurrency", "4"), node_worker(3, "--concurrency", "4")]
    registered(2)
    stop = threading.Event()
    enqueued: list[str] = []
    failures: list[str] = []

    def produce() -> None:
        with galera.on_node(1):
            index = 0
            while not stop.is_set():
                label = f"p{index}"
                try:
                    tasks.record.enqueue(label)
                    enqueued.append(label)
                except Exception as exc:  # noqa: BLE001 - node 1 stays up: none expected
                    failures.append(repr(exc))
                index += 1
                time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        time.sleep(2)
        galera.cluster("kill", "3")
        killed_at = time.monotonic()
        time.sleep(3)
        galera.cluster("start-node", "3")
        rejoined = time.monotonic() - killed_at
        time.sleep(1)
    finally:
        stop.set()
        producer.join(30)
    assert failures == []
    wait_for(lambda: {label for label, _ in ledger()} >= set(enqueued), timeout=60,
             message="every enqueued message run after the node came back")
    drained = time.monotonic() - killed_at
    runs = [label for label, _ in ledger()]
    duplicates = len(runs) - len(set(runs))
    print(f"{len(enqueued)} enqueued, 0 lost, {duplicates} run twice; node 3 back (Synced) "
          f"{rejoined:.1f}s after its kill -9, queue drained {drained:.1f}s after it")
    assert "Synced" in galera.cluster("status")
    for worker in workers:
        assert worker.popen.poll() is None, worker.output()  # rode the outage out


# --------------------------------------------------------------------------- your transactions


def test_an_enqueuing_transaction_that_loses_a_conflict_is_run_again_whole():
    """Your transaction writes a row and enqueues on node 2; node 1 commits a change to
    that row before your COMMIT: the COMMIT fails (1213). @retry_on_conflict runs it again;
    the message exists once, with the business row of the run that committed."""
    from django_mysqlq.conflicts import retry_on_conflict
    from tests.testapp.models import Ledger

    with galera.on_node(1):
        row = Ledger.objects.create(label="order", value=0, pid=0)
    runs: list[int] = []

    @retry_on_conflict()
    def place_order() -> int:
        runs.append(1)
        Ledger.objects.filter(pk=row.pk).update(value=len(runs))
        handle = tasks.record.enqueue(f"confirm-{len(runs)}")
        if len(runs) == 1:  # another node commits a change to the same row meanwhile
            galera.query(1, "UPDATE testapp_ledger SET pid = 99 WHERE id = %s", [row.pk])
        return int(handle.id)

    with node_threads(2) as (producer,):
        message_id = producer.call(place_order)
    assert len(runs) == 2
    seen_on(1, "SELECT 1 FROM mysqlq_message WHERE id = %s", [message_id])
    assert galera.query(1, "SELECT task_name, payload FROM mysqlq_message") == [
        ("tests.testapp.tasks.record", '{"args":["confirm-2"],"kwargs":{}}')]
    assert galera.query(1, "SELECT value, pid FROM testapp_ledger WHERE id = %s",
                        [row.pk]) == [(2, 99)]


def test_without_the_retry_the_conflict_reaches_the_caller_and_nothing_is_kept():
    from django.db import OperationalError, transaction

    from tests.testapp.models import Ledger

    with galera.on_node(1):
        row = Ledger.objects.create(label="order", value=0, pid=0)

    def place_order() -> None:
        with transaction.atomic():
            Ledger.objects.filter(pk=row.pk).update(value=1)
            tasks.record.enqueue("confirm")
            galera.query(1, "UPDATE testapp_ledger SET pid = 99 WHERE id = %s", [row.pk])

    with node_threads(2) as (producer,), pytest.raises(OperationalError) as failed:
        producer.call(place_order)
    assert failed.value.args[0] == 1213
    assert galera.query(1, "SELECT COUNT(*) FROM mysqlq_message") == [(0,)]
