"""Two more MariaDB servers for tests/test_multidb.py: ``bench/servers/servers.sh``.

Server "b" (port 3407) holds the second queue database, alias ``queues_b``; server "r"
(port 3408) is a GTID replica of "b", alias ``queues_r`` (``MYSQLQ['READ_DATABASE']``).
They are started once per session (a running one is reused) from a copy of the
distribution's ``mariadbd``; this checkout's database on "b" is made afresh and migrated
(the replica follows). The aliases exist only once the servers answer: they are added to
this process's connections by :func:`start`, and to a worker subprocess's settings
through ``MYSQLQ_TEST_EXTRA_DATABASES`` (tests/settings.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import MySQLdb
import pytest
from django.core.management import call_command
from django.db import connections

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "servers" / "servers.sh"
SERVER = Path("/usr/sbin/mariadbd")
ALIAS_B = "queues_b"
ALIAS_R = "queues_r"
PORTS = {ALIAS_B: 3407, ALIAS_R: 3408}
DATABASE = "test_mysqlq_b_" + hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]


def servers(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"servers.sh {' '.join(args)} failed ({done.returncode}):\n"
                    f"{done.stdout}\n{done.stderr}")
    return done.stdout


def raw(alias: str, database: bool = True) -> Any:
    """A plain autocommit connection to the server of ``alias`` (the test's own eyes)."""
    args: dict[str, Any] = {"host": "127.0.0.1", "port": PORTS[alias], "user": "root",
                            "charset": "utf8mb4", "autocommit": True, "connect_timeout": 5}
    if database:
        args["database"] = DATABASE
    return MySQLdb.connect(**args)


def wait_replicated(timeout: float = 30.0) -> None:
    """Until the replica has applied everything "b" wrote so far (GTID position)."""
    source = raw(ALIAS_B, database=False)
    replica = raw(ALIAS_R, database=False)
    try:
        cursor = source.cursor()
        cursor.execute("SELECT @@gtid_binlog_pos")
        (position,) = cursor.fetchone()
        cursor = replica.cursor()
        cursor.execute("SELECT MASTER_GTID_WAIT(%s, %s)", [position, timeout])
        (answer,) = cursor.fetchone()
        if answer != 0:
            pytest.fail(f"the replica did not reach {position} in {timeout}s")
    finally:
        source.close()
        replica.close()


def start() -> None:
    """Start both servers (or check they run), make this checkout's database on "b"
    afresh, add the aliases to this process and migrate ``queues_b``."""
    if not SERVER.exists() or shutil.which("mariadb-install-db") is None:
        pytest.skip("mariadbd or mariadb-install-db is not installed: no second server")
    servers("start-replica")
    conn = raw(ALIAS_B, database=False)
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{DATABASE}`")
        conn.cursor().execute(f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    base = connections["default"].settings_dict
    for alias, port in PORTS.items():
        entry = {**base, "HOST": "127.0.0.1", "PORT": port, "NAME": DATABASE,
                 "CONN_MAX_AGE": 0,
                 # The replica is "b" seen elsewhere: a test case never flushes it.
                 "TEST": {**base["TEST"], "NAME": DATABASE,
                          "MIRROR": ALIAS_B if alias == ALIAS_R else None}}
        connections.settings[alias] = entry
    call_command("migrate", database=ALIAS_B, verbosity=0)
    wait_replicated()


def extra_env(queues: dict[str, str], read: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of a worker subprocess that knows both aliases and puts ``queues``
    (name -> alias) on them."""
    extra = {alias: {"PORT": port, "NAME": DATABASE} for alias, port in PORTS.items()}
    env = {"MYSQLQ_TEST_EXTRA_DATABASES": json.dumps(extra),
           "MYSQLQ_TEST_QUEUES": json.dumps(
               {queue: {"DATABASE": alias} for queue, alias in queues.items()})}
    if read:
        env["MYSQLQ_TEST_READ_DATABASE"] = json.dumps(read)
    return env


def query(alias: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def wait_rows(alias: str, sql: str, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        [(found,)] = query(alias, sql)
        if found >= count:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{alias}: {sql} gave {found}, wanted {count}, after {timeout}s")
        time.sleep(0.05)
