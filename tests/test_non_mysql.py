"""A project on SQLite or PostgreSQL: with the test mode on, ``check``, ``migrate``,
``runserver`` and its own ``test`` run; without it, the check says what to do.

Each command runs for real in a subprocess, on the small project in tests/nonmysql/.
PostgreSQL: 127.0.0.1:5432, trust auth (user from MYSQLQ_TEST_PG_USER, default postgres);
its tests are skipped when psycopg or the server is missing.
"""

from __future__ import annotations

import hashlib
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PG_USER = os.environ.get("MYSQLQ_TEST_PG_USER", "postgres")
#: One database per checkout, as for MySQL: parallel checkouts don't meet.
PG_NAME = "mysqlq_nonmysql_" + hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]


def manage(project: dict[str, str], *args: str, timeout: float = 300
           ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **project, "PYTHONPATH": str(ROOT),
           "DJANGO_SETTINGS_MODULE": "tests.nonmysql.settings", "PYTHONWARNINGS": ""}
    return subprocess.run([sys.executable, "-m", "django", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _pg_admin(statement: str) -> None:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=5432, user=PG_USER, dbname="postgres",
                         autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement)


@pytest.fixture
def sqlite(tmp_path: Path) -> dict[str, str]:
    return {"NONMYSQL_ENGINE": "sqlite", "NONMYSQL_NAME": str(tmp_path / "shop.sqlite3")}


@pytest.fixture
def postgresql() -> Iterator[dict[str, str]]:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    try:
        _pg_admin(f'DROP DATABASE IF EXISTS "{PG_NAME}"')
        _pg_admin(f'CREATE DATABASE "{PG_NAME}"')
    except Exception as exc:  # noqa: BLE001 - no server: nothing to test against
        pytest.skip(f"no PostgreSQL on 127.0.0.1:5432 for user {PG_USER}: {exc}")
    yield {"NONMYSQL_ENGINE": "postgresql", "NONMYSQL_NAME": PG_NAME,
           "NONMYSQL_PG_USER": PG_USER}
    _pg_admin(f'DROP DATABASE IF EXISTS "{PG_NAME}"')
    _pg_admin(f'DROP DATABASE IF EXISTS "test_{PG_NAME}"')


@pytest.fixture(params=["sqlite", "postgresql"])
def project(request: pytest.FixtureRequest) -> dict[str, str]:
    return dict(request.getfixturevalue(request.param))


def test_without_the_test_mode_the_check_refuses_and_says_what_to_do(project):
    for command in (["check"], ["migrate"]):
        done = manage(project, *command)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "(django_mysqlq.E003)" in done.stderr
        assert "MYSQLQ = {'IMMEDIATE': True}" in done.stderr
        assert "Traceback" not in done.stderr


def test_with_the_test_mode_check_migrate_and_the_projects_tests_run(project):
    on = {**project, "NONMYSQL_IMMEDIATE": "1"}
    done = manage(on, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout

    done = manage(on, "migrate", "--no-input")
    assert done.returncode == 0, done.stdout + done.stderr
    # The queue's own migrations run on this database too (the tables stay unused).
    for migration in ("0001_initial", "0003_exact_collation", "0004_operator_tooling",
                      "0007_admin_indexes"):
        assert f"Applying django_mysqlq.{migration}... OK" in done.stdout
    done = manage(on, "migrate", "--check")
    assert done.returncode == 0, done.stdout + done.stderr

    done = manage(on, "test", "tests.nonmysql.shop.suite", "--no-input", "-v", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Ran 7 tests" in done.stderr and "\nOK" in done.stderr
    assert "FAIL" not in done.stderr and "skipped" not in done.stderr


def test_runserver_starts_with_the_test_mode(project):
    env = {**os.environ, **project, "NONMYSQL_IMMEDIATE": "1", "PYTHONPATH": str(ROOT),
           "DJANGO_SETTINGS_MODULE": "tests.nonmysql.settings", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", "--noreload", "127.0.0.1:0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    assert server.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in server.stdout],
                              daemon=True)
    reader.start()
    output = ""
    try:
        deadline = time.monotonic() + 60
        while "Quit the server with" not in output and time.monotonic() < deadline:
            try:
                output += lines.get(timeout=0.5)
            except queue.Empty:
                if server.poll() is not None:
                    break
    finally:
        server.kill()
        server.wait(timeout=10)
        reader.join(timeout=10)
        server.stdout.close()
    assert "System check identified no issues" in output, output
    assert "development server at http://127.0.0.1:" in output, output
