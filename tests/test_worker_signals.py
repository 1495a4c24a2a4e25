"""Real ``runqueueworker`` processes, real signals: crashes, graceful stops, a server restart.

Every test here starts worker subprocesses (the ``start_worker`` fixture) and acts on
them from outside the way an operator or an orchestrator would: ``SIGKILL``,
``SIGTERM``/``SIGINT`` (once or twice), ``--burst``/``--max-tasks`` exits, and a restart
of the MariaDB server under a running worker. What is checked is what a person would
see afterwards: the ledger rows the tasks wrote, the hot table, the history table and
the workers table.

Timeouts below are liveness bounds (how long to wait before calling a test failed),
never performance assertions.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from django.db import connection

from django_mysqlq.models import Attempt, Message, Worker
from tests.conftest import WorkerProcess, wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

#: How long a test waits for a worker to exit, recover, or finish something it was given.
PATIENCE = 15.0
#: How long a worker may take to start (Python and Django on a loaded machine).
START_PATIENCE = 60.0


# --------------------------------------------------------------------------- helpers


def rows(label: str) -> list[int]:
    """Pids of the processes that wrote a ledger row with this label."""
    return list(Ledger.objects.filter(label=label).order_by("id").values_list("pid", flat=True))


def started(labels: Iterable[str]) -> set[str]:
    return {label for label in labels if Ledger.objects.filter(label=f"{label}:start").exists()}


def outcomes(message_id: int) -> list[str]:
    return list(Attempt.objects.for_message(message_id).values_list("outcome", flat=True))


def worker_row(process: WorkerProcess) -> Worker:
    """The workers-table row a subprocess registered (waits for it to register)."""
    wait_for(lambda: Worker.objects.filter(pid=process.pid).exists(), timeout=PATIENCE,
             message=f"worker {process.pid} to register")
    return Worker.objects.get(pid=process.pid)


def wait_for_output(process: WorkerProcess, text: str, timeout: float = PATIENCE) -> None:
    wait_for(lambda: text in process.output(), timeout=timeout,
             message=f"{text!r} in the output of worker {process.pid}")


def wait_started(process: WorkerProcess) -> None:
    """Until the worker has started: a bounded wait after it then times the worker, not
    its Python and Django start-up (its first round sweeps for vanished peers)."""
    wait_for_output(process, "started: queues=", timeout=START_PATIENCE)


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """The file whose creation ends the ``slow_until_opened`` tasks given its path: they
    run as long as a test needs, however loaded the machine, and then end at once."""
    return tmp_path / "gate"


def wait_exit(process: WorkerProcess, timeout: float = PATIENCE) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker {process.pid} still running after {timeout}s:\n{process.output()}")


def claimed_by(process: WorkerProcess, ids: Iterable[int]) -> bool:
    """Whether every one of these messages is claimed by this worker process."""
    ids = list(ids)
    prefix_pid = f":{process.pid}:"
    held = Message.objects.claimed().filter(pk__in=ids).values_list("worker_id", flat=True)
    return len(held) == len(ids) and all(prefix_pid in (w or "") for w in held)


def acked(ids: Iterable[int]) -> bool:
    """Whether every one of these messages has been acked (deleted with a success row).

    Waits on the ack, not on the task's last ledger row: that row is written before the
    task returns, a moment before the worker acks.
    """
    ids = list(ids)
    return Attempt.objects.succeeded().filter(message_id__in=ids).count() == len(ids)


def assert_lost_then_succeeded(message_id: int, dead: WorkerProcess,
                               peer: WorkerProcess) -> None:
    """The history of a message run by ``dead`` when it died, then by ``peer``."""
    attempts = list(Attempt.objects.for_message(message_id))
    assert [a.outcome for a in attempts] == ["lost", "succeeded"], attempts
    lost, succeeded = attempts
    assert lost.error_class == "WorkerLost"
    assert "is gone" in lost.error_message  # the owner's connection vanished
    assert f":{dead.pid}:" in lost.worker_id
    # An attempt counts only if it had started (and the worker had recorded it).
    counted = "had not started" not in lost.error_message
    assert (lost.attempt, succeeded.attempt) == (1, 2 if counted else 1)
    assert succeeded.pid == peer.pid
    assert f":{peer.pid}:" in succeeded.worker_id


# --------------------------------------------------------------------------- SIGKILL


def test_kill_9_claims_are_recovered_and_run_by_a_new_peer(start_worker, gate):
    """A worker killed holding running and unstarted claims loses nothing."""
    labels = [f"k{i}" for i in range(4)]
    worker_a = start_worker("--concurrency", "2", "--batch", "4")
    # They run until the gate opens: A's two are killed mid-run however slow the machine.
    handles = tasks.slow_until_opened.enqueue_many([[label, str(gate)] for label in labels])
    ids = [h.id for h in handles]
    # A holds all four: two running on its threads, two waiting in its inbox.
    wait_for(lambda: claimed_by(worker_a, ids) and len(started(labels)) == 2,
             timeout=PATIENCE, message="worker A to claim all four and start two")
    # A records which messages started about once a second: wait until it has.
    wait_for(lambda: Message.objects.filter(pk__in=ids, started_at__isnull=False).count() == 2,
             timeout=PATIENCE, message="worker A to record the two starts")
    worker_a.signal(signal.SIGKILL)
    assert worker_a.wait(timeout=10) == -signal.SIGKILL
    assert not Ledger.objects.filter(label__endswith=":end").exists()  # killed mid-run
    assert Message.objects.claimed().count() == 4  # nobody gave them back: A just died

    gate.touch()  # B's runs end at once
    worker_b = start_worker("--concurrency", "4", "--batch", "4")
    wait_started(worker_b)
    wait_for(lambda: Attempt.objects.lost().count() == 4, timeout=10,
             message="worker B to recover the four claims as lost")
    wait_for(lambda: acked(ids), timeout=PATIENCE,
             message="every message to run to its end on worker B")
    assert not Message.objects.filter(pk__in=ids).exists()
    for label in labels:
        assert rows(f"{label}:end") == [worker_b.pid]  # run to its end exactly once
    for message_id in ids:
        assert_lost_then_succeeded(message_id, worker_a, worker_b)
    # The two A had started spent an attempt; the two waiting in its inbox did not.
    first_attempts = sorted(Attempt.objects.filter(message_id__in=ids, outcome="succeeded")
                            .values_list("attempt", flat=True))
    assert first_attempts == [1, 1, 2, 2]
    # The two A had started ran again on B (at-least-once); the two it had not, once.
    starts_on_a = Ledger.objects.filter(label__endswith=":start", pid=worker_a.pid).count()
    assert 1 <= starts_on_a <= 2
    assert "Recovered 4 message(s) from vanished workers" in worker_b.output()


def test_kill_9_claims_are_recovered_by_a_peer_already_running(start_worker, gate):
    """An idle peer that was up before the crash notices it and takes the work over."""
    labels = [f"p{i}" for i in range(3)]
    worker_a = start_worker("--concurrency", "2", "--batch", "4")
    # They run until the gate opens: A holds all three for as long as B takes to start.
    handles = tasks.slow_until_opened.enqueue_many([[label, str(gate)] for label in labels])
    ids = [h.id for h in handles]
    wait_for(lambda: claimed_by(worker_a, ids) and started(labels), timeout=PATIENCE,
             message="worker A to claim all three and start one")

    worker_b = start_worker("--queues", "other,default", "--concurrency", "3")
    wait_for_output(worker_b, "started: queues=other,default", timeout=START_PATIENCE)
    worker_row(worker_b)
    # B is up and polling, and leaves a live peer's claims alone.
    time.sleep(1.0)
    assert claimed_by(worker_a, ids)
    assert not Attempt.objects.exists()

    worker_a.signal(signal.SIGKILL)
    assert worker_a.wait(timeout=10) == -signal.SIGKILL
    gate.touch()  # B's runs end at once
    wait_for(lambda: Attempt.objects.lost().count() == 3, timeout=10,
             message="the running peer B to recover A's claims")
    wait_for(lambda: acked(ids), timeout=PATIENCE,
             message="every message to run to its end on worker B")
    assert worker_b.popen.poll() is None  # the same B, still running
    assert not Message.objects.filter(pk__in=ids).exists()
    for message_id in ids:
        assert_lost_then_succeeded(message_id, worker_a, worker_b)
    for label in labels:
        assert rows(f"{label}:end") == [worker_b.pid]


# --------------------------------------------------------------------------- SIGTERM / SIGINT


def graceful_stop(start_worker, gate: Path, signum: int, count: int) -> None:
    """One worker, one task thread, ``count`` claimed; stop it with ``signum`` mid-task.
    The running task lasts until the worker has heard the signal (the gate opens then),
    however slow the machine is to see it start."""
    labels = [f"g{i}" for i in range(count)]
    worker = start_worker("--concurrency", "1", "--batch", str(count))
    handles = tasks.slow_until_opened.enqueue_many([[label, str(gate)] for label in labels])
    ids = {label: h.id for label, h in zip(labels, handles, strict=True)}
    wait_for(lambda: claimed_by(worker, ids.values()) and started(labels), timeout=PATIENCE,
             message="the worker to claim every message and start the first")
    worker.signal(signum)
    wait_for(lambda: f"{signal.Signals(signum).name} received" in worker.output(),
             timeout=PATIENCE, message="the worker to hear the signal")
    gate.touch()  # the running task ends now, during the stop
    status = wait_exit(worker)  # GRACE_SECONDS is 10 in the tests: it comes well before
    output = worker.output()
    assert status == 0, output
    assert f"{signal.Signals(signum).name} received" in output

    ran = started(labels)
    assert ran == {labels[0]}, "only the message already running may run"
    # The running one finished and was acked.
    assert rows(f"{labels[0]}:end") == [worker.pid]
    assert outcomes(ids[labels[0]]) == ["succeeded"]
    assert not Message.objects.filter(pk=ids[labels[0]]).exists()
    # The unstarted ones went back as if never claimed: no attempt spent, no owner.
    for label in labels[1:]:
        message = Message.objects.get(pk=ids[label])
        assert message.status == "ready"
        assert message.attempts == 0
        assert message.claim_token is None
        assert message.owner_connection is None and message.worker_id is None
        assert message.claimed_at is None and message.lease_expires_at is None
        assert outcomes(ids[label]) == []
    assert f"Released {count - 1} claimed but unstarted message(s)." in output
    row = Worker.objects.get(pid=worker.pid)
    assert row.stopped_at is not None
    assert row.processed == 1


def test_sigterm_finishes_the_running_task_and_releases_the_rest(start_worker, gate):
    graceful_stop(start_worker, gate, signal.SIGTERM, count=5)


def test_sigint_stops_as_gracefully_as_sigterm(start_worker, gate):
    graceful_stop(start_worker, gate, signal.SIGINT, count=3)


def test_a_second_sigterm_exits_at_once_and_a_peer_recovers(start_worker, gate):
    # Both first, so that one claim takes them both: one runs (until the gate opens,
    # after A is gone), the other waits.
    handle, waiting = tasks.slow_until_opened.enqueue_many(
        [["twice", str(gate)], ["waiting", str(gate)]])
    worker_a = start_worker("--concurrency", "1")
    wait_for(lambda: rows("twice:start") and claimed_by(worker_a, [handle.id, waiting.id]),
             timeout=PATIENCE, message="the task to start, the other to wait")
    worker_a.signal(signal.SIGTERM)
    # Signals of one kind coalesce until Python runs the handler: wait until it has.
    wait_for_output(worker_a, "SIGTERM received")
    worker_a.signal(signal.SIGTERM)
    status = wait_exit(worker_a, timeout=10)
    output = worker_a.output()
    assert status == 1, output
    assert "Second SIGTERM: exiting now" in output
    # It did not wait for the running task (its claim is left to a peer), but it gave
    # back what had not started, with its attempt, and said it stopped.
    assert rows("twice:end") == []
    message = Message.objects.get(pk=handle.id)
    assert message.status == "claimed"
    assert f":{worker_a.pid}:" in (message.worker_id or "")
    left = Message.objects.get(pk=waiting.id)
    assert (left.status, left.attempts, left.claim_token) == ("ready", 0, None)
    assert Worker.objects.get(pid=worker_a.pid).stopped_at is not None

    gate.touch()  # B's run ends at once
    worker_b = start_worker()
    wait_started(worker_b)
    wait_for(lambda: acked([handle.id]), timeout=PATIENCE,
             message="a new worker to recover the message and run it")
    assert rows("twice:end") == [worker_b.pid]
    assert rows("twice:start") == [worker_a.pid, worker_b.pid]
    assert_lost_then_succeeded(handle.id, worker_a, worker_b)
    assert not Message.objects.filter(pk=handle.id).exists()


def test_a_task_outliving_the_grace_period_is_abandoned_and_recovered(start_worker, gate):
    worker_a = start_worker("--concurrency", "1", env={"MYSQLQ_TEST_GRACE": "1"})
    handle = tasks.slow_until_opened.enqueue("outlives", str(gate))  # opened after A exits
    wait_for(lambda: rows("outlives:start"), timeout=PATIENCE, message="the task to start")
    worker_a.signal(signal.SIGTERM)
    status = wait_exit(worker_a, timeout=10)
    output = worker_a.output()
    assert status == 1, output  # not a clean stop: a task was abandoned
    assert "still running after the 1s grace period" in output
    assert rows("outlives:end") == []
    message = Message.objects.get(pk=handle.id)
    assert message.status == "claimed"  # left for a peer, not released: it had started
    assert Worker.objects.get(pid=worker_a.pid).stopped_at is not None  # it deregistered

    gate.touch()  # B's run ends at once
    worker_b = start_worker()
    wait_started(worker_b)
    wait_for(lambda: Attempt.objects.lost().filter(message_id=handle.id).exists(),
             timeout=10, message="a peer to recover the abandoned claim")
    wait_for(lambda: rows("outlives:start") == [worker_a.pid, worker_b.pid], timeout=PATIENCE,
             message="the peer to run the message again")


# --------------------------------------------------------------------------- --burst, --max-tasks


def test_a_draining_worker_keeps_its_leases_so_no_peer_runs_its_task_twice(start_worker):
    short_lease = {"MYSQLQ_TEST_LEASE": "2", "MYSQLQ_TEST_HEARTBEAT": "0.5",
                   "MYSQLQ_TEST_GRACE": "15"}
    stopping = start_worker("--concurrency", "1", env=short_lease)
    handle = tasks.slow.enqueue("drain", 5)
    wait_for(lambda: started(["drain"]), PATIENCE, message="the task to start")
    peer = start_worker("--concurrency", "1", env=short_lease)
    wait_for(lambda: Worker.objects.filter(pid=peer.pid).exists(), PATIENCE,
             message="the peer to register")
    stopping.signal(signal.SIGTERM)
    # The task outlives the lease 2 times over; heartbeats during the drain keep it owned.
    assert wait_exit(stopping, 20) == 0, stopping.output()
    assert outcomes(handle.id) == ["succeeded"]
    assert len(rows("drain:start")) == 1
    assert "Recovered" not in peer.output()


def test_burst_waits_for_running_tasks_and_due_retries_then_exits_0(start_worker):
    tasks.record.enqueue_many([[f"r{i}"] for i in range(5)])
    slow = tasks.slow.enqueue("burst-slow", 1)
    flaky = tasks.fails_until.enqueue("burst-flaky", succeed_on=2)  # retried after ~0.1s
    worker = start_worker("--burst", "--concurrency", "2", "--batch", "3")
    status = wait_exit(worker)
    output = worker.output()
    assert status == 0, output
    assert not Message.objects.exists()  # drained: nothing ready, claimed or scheduled
    assert Ledger.objects.filter(label__startswith="r").count() == 5
    assert rows("burst-slow:end") == [worker.pid]  # it did not exit under a running task
    assert outcomes(slow.id) == ["succeeded"]
    assert outcomes(flaky.id) == ["retried", "succeeded"]  # it waited for the due retry
    assert Attempt.objects.succeeded().count() == 7
    assert Worker.objects.get(pid=worker.pid).stopped_at is not None


def test_max_tasks_exits_after_that_many_messages(start_worker):
    limit = 5
    handles = tasks.record.enqueue_many([[f"m{i}"] for i in range(limit + 3)])
    worker = start_worker("--max-tasks", str(limit), "--concurrency", "1", "--batch", "2")
    status = wait_exit(worker)
    output = worker.output()
    assert status == 0, output
    assert f"reached --max-tasks {limit}" in output
    assert Attempt.objects.succeeded().count() == limit
    assert Attempt.objects.count() == limit
    assert Ledger.objects.count() == limit
    remaining = Message.objects.all()
    assert len(remaining) == 3
    assert all(m.status == "ready" and m.attempts == 0 for m in remaining)
    # FIFO: the first ``limit`` ran, the last three wait.
    assert {m.pk for m in remaining} == {h.id for h in handles[limit:]}


# --------------------------------------------------------------------------- lost connections


def kill_worker_connections() -> list[int]:
    """``KILL`` every connection to the test database but this test's own one."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> "
            "CONNECTION_ID()", [connection.settings_dict["NAME"]])
        ids = [int(row[0]) for row in cursor.fetchall()]
        for connection_id in ids:
            cursor.execute(f"KILL CONNECTION {connection_id}")
    return ids


def test_a_lost_task_thread_connection_does_not_cost_an_attempt(start_worker):
    worker = start_worker("--concurrency", "1")
    warm = tasks.record.enqueue("warm")  # the one task thread now holds a connection
    wait_for(lambda: acked([warm.id]), timeout=PATIENCE, message="the first message")
    assert len(kill_worker_connections()) >= 2  # the control thread's and the task thread's
    wait_for_output(worker, "Database error")  # the control loop noticed and reconnects
    after = tasks.record.enqueue("after-kill")
    wait_for(lambda: acked([after.id]), timeout=PATIENCE,
             message="the worker to process a message after losing its connections")
    assert worker.popen.poll() is None
    assert rows("after-kill") == [worker.pid]
    assert outcomes(after.id) == ["succeeded"], worker.output()


# --------------------------------------------------------------------------- server restart

ADMIN = ["mariadb-admin", "--host=127.0.0.1", "--user=root", "--connect-timeout=2"]
SERVER = "/usr/sbin/mariadbd"
SERVER_PATIENCE = 60.0


def server_answers() -> bool:
    return subprocess.run([*ADMIN, "ping"], capture_output=True, timeout=30).returncode == 0


#: The server's pid file (Debian's default): other mariadbd processes on the machine (a
#: second instance, cluster nodes) are not the one this test restarts.
PID_FILE = "/run/mysqld/mysqld.pid"


def server_process_exists() -> bool:
    result = subprocess.run(["start-stop-daemon", "--status", "--pidfile", PID_FILE,
                             "--exec", SERVER], capture_output=True, timeout=30)
    return result.returncode == 0


def start_server() -> None:
    """Start MariaDB again (after the old process is fully gone) and wait until it answers."""
    if server_answers():
        return
    wait_for(lambda: not server_process_exists(), timeout=SERVER_PATIENCE, interval=0.2,
             message="the old MariaDB process to exit")
    subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background",
                    "--pidfile", PID_FILE, "--exec", SERVER],
                   check=True, capture_output=True, timeout=30)
    wait_for(server_answers, timeout=SERVER_PATIENCE, interval=0.5,
             message="MariaDB to answer after its restart")


def test_a_running_worker_survives_a_database_server_restart(start_worker):
    """Keep last: it restarts the shared MariaDB server."""
    worker = start_worker("--concurrency", "1")
    before = tasks.record.enqueue("before-restart")
    wait_for(lambda: outcomes(before.id) == ["succeeded"], timeout=PATIENCE,
             message="the first message to be processed")
    try:
        subprocess.run([*ADMIN, "shutdown"], check=True, capture_output=True, timeout=60)
        wait_for(lambda: not server_answers(), timeout=SERVER_PATIENCE, interval=0.2,
                 message="MariaDB to stop answering")
        # The worker runs into the outage (it polls every 0.2 s) and must log it.
        wait_for_output(worker, "Database error", timeout=10)
    finally:
        start_server()
    connection.close()  # this test's own connection died with the server

    after = tasks.record.enqueue("after-restart")
    wait_for(lambda: acked([after.id]), timeout=30,
             message="the same worker to process a message after the restart")
    assert worker.popen.poll() is None, worker.output()
    assert rows("after-restart") == [worker.pid]
    attempts = list(Attempt.objects.for_message(after.id))
    # Only this worker touched it, and it ended succeeded. (That a task thread's stale
    # connection costs no attempt is test_a_lost_task_thread_connection_does_not_cost_an_
    # attempt's job: this check stays loose, since the restart's timing varies.)
    assert all(a.pid == worker.pid for a in attempts)
    assert attempts[-1].outcome == "succeeded"
    assert not Message.objects.filter(pk=after.id).exists()
    assert Worker.objects.get(pid=worker.pid).stopped_at is None  # still registered, alive
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker) == 0, worker.output()


def test_ordered_subjects_keep_their_order_through_a_database_server_restart(start_worker):
    """Keep last too: it restarts the shared MariaDB server. Subjects in flight when the
    server goes away: whatever ran twice (an ack lost with the connection) ran again before
    anything after it, and no subject ever ran two messages at once."""
    from tests.subject_support import order_violations, succeeded_seqs
    from tests.testapp import gated

    label = "restart"
    gated.ordered_step.enqueue_many([gated.ordered_step.call(f"s{s}", seq, label, 100)
                                     for seq in range(8) for s in range(6)])
    worker = start_worker("--concurrency", "4", "--batch", "4")
    wait_for(lambda: ok_gate_runs(label) >= 10, timeout=PATIENCE,
             message="some ordered messages to run")
    try:
        subprocess.run([*ADMIN, "shutdown"], check=True, capture_output=True, timeout=60)
        wait_for(lambda: not server_answers(), timeout=SERVER_PATIENCE, interval=0.2,
                 message="MariaDB to stop answering")
    finally:
        start_server()
    connection.close()
    wait_for(lambda: not Message.objects.filter(gate_key__isnull=False).exists(),
             timeout=120, interval=0.5, message="every subject to drain after the restart")
    assert worker.popen.poll() is None, worker.output()
    assert order_violations(label, killed=frozenset({worker.pid})) == []
    assert all(sorted(set(seqs)) == list(range(8)) for seqs in succeeded_seqs(label).values())
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker) == 0, worker.output()


def ok_gate_runs(label: str) -> int:
    from tests.testapp.models import GateRun

    return GateRun.objects.filter(label=label, edge="end", outcome="ok").count()
