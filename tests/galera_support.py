"""The 3-node Galera cluster of ``bench/cluster/galera.sh`` for tests/test_galera.py.

The cluster is started once per session (idempotent: a running one is reused) and holds
one database of this checkout's. In the test process a thread reaches node N by taking
a "default" connection of its own to that node (:func:`on_node`): the broker always uses
the queue's alias, so producers, parked workers and sweepers of one test can sit on
different nodes. Worker subprocesses get the node's port through ``MYSQLQ_TEST_PORT``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import MySQLdb
import pytest
from django.db import connections

from bench.cluster import PORTS, PROVIDER, SCRIPT

ROOT = Path(__file__).resolve().parent.parent
DATABASE = os.environ.get(
    "MYSQLQ_TEST_GALERA_DB", "mysqlq_galera_" + hashlib.sha1(str(ROOT).encode()).hexdigest()[:8])
#: Emptied before each test (the Django tables stay).
TABLES = ("mysqlq_message", "mysqlq_attempt", "mysqlq_worker", "mysqlq_lease", "mysqlq_queue",
          "mysqlq_gate", "mysqlq_schedule", "testapp_ledger")


def cluster(*args: str, timeout: float = 240) -> str:
    """Run ``galera.sh`` with these arguments; its output (it fails the test on error)."""
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"galera.sh {' '.join(args)} failed ({done.returncode}):\n"
                    f"{done.stdout}\n{done.stderr}")
    return done.stdout


def start() -> None:
    """Start the cluster (or check it runs), make this checkout's database anew, migrate it."""
    if not PROVIDER.exists():
        pytest.skip("galera-4 is not installed (bash .ci/setup installs it)")
    cluster("start")
    with raw(1, database=False) as conn:
        # Made afresh each session, like Django's test database: nothing a run of another
        # version left (tables, migration records) can matter.
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{DATABASE}`")
        conn.cursor().execute(f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4")
    done = subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT,
                          env=node_env(1), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"migrate on the cluster failed:\n{done.stdout}\n{done.stderr}")


def node_env(node: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of a subprocess (tests.settings) whose queue database is on ``node``."""
    env = dict(base if base is not None else os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({"MYSQLQ_TEST_HOST": "127.0.0.1", "MYSQLQ_TEST_PORT": str(PORTS[node]),
                "MYSQLQ_TEST_USER": "root", "MYSQLQ_TEST_PASSWORD": "",
                "MYSQLQ_TEST_DB": DATABASE})
    return env


@contextlib.contextmanager
def raw(node: int, database: bool = True) -> Iterator[Any]:
    """A plain autocommit MySQLdb connection to ``node`` (the test's own eyes and hands)."""
    args: dict[str, Any] = {"host": "127.0.0.1", "port": PORTS[node], "user": "root",
                            "charset": "utf8mb4", "autocommit": True, "connect_timeout": 5}
    if database:
        args["database"] = DATABASE
    conn = MySQLdb.connect(**args)
    try:
        yield conn
    finally:
        with contextlib.suppress(MySQLdb.Error):
            conn.close()


def query(node: int, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with raw(node) as conn:
        cursor = conn.cursor()
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def empty_tables() -> None:
    with raw(1) as conn:
        cursor = conn.cursor()
        for table in TABLES:
            cursor.execute(f"DELETE FROM {table}")


@contextlib.contextmanager
def on_node(node: int) -> Iterator[None]:
    """This thread's "default" connection goes to ``node`` until the block ends."""
    previous = connections["default"]
    settings_dict = {**previous.settings_dict, "HOST": "127.0.0.1", "PORT": PORTS[node],
                     "NAME": DATABASE, "USER": "root", "PASSWORD": "", "CONN_MAX_AGE": 0}
    connections["default"] = type(previous)(settings_dict, alias="default")
    try:
        yield
    finally:
        connections["default"].close()
        connections["default"] = previous
