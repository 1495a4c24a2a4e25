"""Fixtures shared by the suite: real MariaDB, real worker subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output"


def raw_connection(**options: Any) -> Any:
    """An autocommit MySQLdb connection of its own to the tests' database, outside Django
    (a stranger who locks tables or rows, kills statements); ``options`` go to the
    driver (``local_infile=1``)."""
    import MySQLdb

    params = connection.settings_dict
    conn = MySQLdb.connect(host=params["HOST"], port=int(params["PORT"]), user=params["USER"],
                           password=params["PASSWORD"], database=params["NAME"], **options)
    conn.autocommit(True)
    return conn


@contextlib.contextmanager
def held_by_stranger(locking_read: str) -> Iterator[None]:
    """The rows ``locking_read`` (a ``… FOR UPDATE``) takes, held by an open transaction
    of another connection until the block ends."""
    stranger = raw_connection()
    try:
        cursor = stranger.cursor()
        cursor.execute("START TRANSACTION")
        cursor.execute(locking_read)
        yield
    finally:
        stranger.rollback()
        stranger.close()


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.05,
             message: str = "condition") -> object:
    """Poll until ``predicate()`` is truthy; fail the test with ``message`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


@pytest.fixture(scope="session", autouse=True)
def _partitioned_history(request: pytest.FixtureRequest) -> None:
    """``MYSQLQ_TEST_PARTITIONED_HISTORY=N``: the run's history table is partitioned by
    ranges of N ids (``queuehistory partition``), to run any test file on that layout."""
    width = os.environ.get("MYSQLQ_TEST_PARTITIONED_HISTORY")
    if not width:
        return
    request.getfixturevalue("django_db_setup")
    with request.getfixturevalue("django_db_blocker").unblock():
        from django_mysqlq.broker import partitions

        partitions.partition(int(width), ahead=int(os.environ.get("MYSQLQ_TEST_AHEAD", "2")))


@pytest.fixture(autouse=True)
def _usable_connection(request: pytest.FixtureRequest) -> None:
    """Start each database test on a live connection, even after a server restart."""
    if "django_db_setup" not in request.fixturenames:
        return
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.is_usable():
            conn.close()


class WorkerProcess:
    """A real ``runqueueworker`` subprocess with its output captured to a file."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout=timeout)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def worker_env() -> dict[str, str]:
    """Environment for subprocesses: same settings, pointed at the test database."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["MYSQLQ_TEST_DB"] = connection.settings_dict["NAME"]
    env["PYTHONUNBUFFERED"] = "1"
    return env


class WorkerStarter:
    """Starts ``runqueueworker`` subprocesses with a base environment, output to files
    under test-output/ named after the test, and kills whatever still runs at the end."""

    def __init__(self, request: pytest.FixtureRequest, base_env: dict[str, str]) -> None:
        self.request = request
        self.base_env = base_env
        self.started: list[WorkerProcess] = []
        OUTPUT.mkdir(exist_ok=True)

    def start(self, *args: str, env: dict[str, str] | None = None,
              label: str = "") -> WorkerProcess:
        name = f"{self.request.node.name}{label}-{len(self.started)}".replace("/", "_")[:150]
        log_path = OUTPUT / f"worker-{name}.log"
        with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(
                [sys.executable, "-m", "django", "runqueueworker", *args],
                cwd=ROOT, env={**self.base_env, **(env or {})}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        process = WorkerProcess(popen, log_path)
        self.started.append(process)
        return process

    def kill_all(self) -> None:
        for process in self.started:
            # The whole process group: a supervisor's children must not outlive the test.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            if process.popen.poll() is None:
                process.popen.wait(timeout=10)
        if self.started:
            end_dead_sessions()


#: Sessions a killed worker leaves on the server: one inside its park's ``SLEEP()`` reads
#: its socket (and sees it closed) only when the sleep ends, holding its named locks (the
#: recovery leader's) until then, so the next test's in-process ``recover()`` finds the
#: lock taken. Every worker of the test is dead by now: any session of the test database
#: still sleeping, or still holding a named lock, is one of theirs.
LEFTOVER_SESSIONS_SQL = """
SELECT ID FROM information_schema.PROCESSLIST
 WHERE DB = DATABASE() AND ID <> CONNECTION_ID()
   AND (INFO LIKE '%SLEEP(%'
        OR ID = IS_USED_LOCK(CONCAT('django_mysqlq:recover:', DATABASE()))
        OR ID = IS_USED_LOCK(CONCAT('mysqlq_archive:', DATABASE())))
"""


def end_dead_sessions() -> None:
    """End the server sessions of the test's killed workers (``LEFTOVER_SESSIONS_SQL``)."""
    import MySQLdb

    conn = raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute(LEFTOVER_SESSIONS_SQL)
        for (session,) in cursor.fetchall():
            with contextlib.suppress(MySQLdb.OperationalError):  # gone meanwhile
                cursor.execute(f"KILL {int(session)}")
    finally:
        conn.close()


@pytest.fixture
def start_worker(request: pytest.FixtureRequest, worker_env: dict[str, str],
                 transactional_db: None) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``runqueueworker`` subprocesses; any still running at teardown are killed."""
    starter = WorkerStarter(request, worker_env)
    yield starter.start
    starter.kill_all()


@pytest.fixture
def root():
    """A test client logged in as a superuser."""
    from django.test import Client

    from tests.operator_support import user

    client = Client()
    client.force_login(user("root", superuser=True))
    return client


@pytest.fixture
def viewer():
    """A test client for staff who may look at the queue but hold no action permission."""
    from django.test import Client

    from tests.operator_support import user

    client = Client()
    client.force_login(user("viewer"))
    return client


@pytest.fixture(scope="session")
def second_server(django_db_setup: None, django_db_blocker: Any) -> None:
    """The second MariaDB server (and its replica) of the several-database tests, started
    once for the session (tests/multidb_support.py)."""
    from tests import multidb_support

    with django_db_blocker.unblock():
        multidb_support.start()
