"""Plain ``MySQLdb`` connections for the harness: setup, server status, the raw floor.

Every connection has connect and read timeouts, and :class:`ServerWatch` notices a
server restart (``Uptime`` going down), so a run fails with a clear message instead of
hanging or mixing figures from before and after a restart.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import MySQLdb
from django.conf import settings

from .errors import BenchError, ServerRestarted
from .workers import cpu_seconds

#: Client errors that mean the server went away: can't connect, gone away, lost.
GONE_ERRORS = frozenset({2002, 2003, 2006, 2013, 2055})
_HISTORY_RE = re.compile(r"History list length (\d+)")


def connect_args(database: bool = True) -> dict[str, Any]:
    conf: dict[str, Any] = settings.DATABASES["default"]
    args: dict[str, Any] = {
        "host": conf["HOST"], "port": int(conf["PORT"]), "user": conf["USER"],
        "password": conf["PASSWORD"], "charset": "utf8mb4", "autocommit": True,
        "connect_timeout": 5, "read_timeout": 900, "write_timeout": 60,
    }
    if database:
        args["database"] = conf["NAME"]
    return args


def connect(database: bool = True) -> Any:
    """A new autocommit connection; a clear :class:`BenchError` when the server is down."""
    try:
        return MySQLdb.connect(**connect_args(database))
    except MySQLdb.OperationalError as exc:
        conf = settings.DATABASES["default"]
        raise BenchError(
            f"Can't connect to MariaDB at {conf['HOST']}:{conf['PORT']} as {conf['USER']} "
            f"({exc}). Start the server (bash .ci/setup) or set MYSQLQ_BENCH_HOST/PORT/USER."
        ) from exc


def is_server_gone(exc: BaseException) -> bool:
    """Whether an error means the server went away (or restarted) under the run."""
    if isinstance(exc, ServerRestarted):
        return True
    code = exc.args[0] if getattr(exc, "args", None) else None
    return isinstance(code, int) and code in GONE_ERRORS


def wait_for_server(timeout: float = 120.0) -> None:
    """Wait until the server accepts connections again (after a restart)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = MySQLdb.connect(**connect_args(database=False))
            conn.close()
            return
        except MySQLdb.OperationalError as exc:
            if time.monotonic() > deadline:
                raise BenchError(f"MariaDB did not come back within {timeout:.0f}s ({exc})."
                                 ) from exc
            time.sleep(1.0)


def ensure_database(afresh: bool = False) -> None:
    """The run's database; ``afresh`` drops it first, so nothing an earlier run (of another
    version: tables, migration records) left can matter."""
    name = settings.DATABASES["default"]["NAME"]
    conn = connect(database=False)
    try:
        if afresh:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def scalar(conn: Any, sql: str, params: Any = None) -> Any:
    cur = conn.cursor()
    cur.execute(sql, params)
    row = cur.fetchone()
    return None if row is None else row[0]


def global_status(conn: Any, *names: str) -> dict[str, int]:
    cur = conn.cursor()
    placeholders = ", ".join(["%s"] * len(names))
    cur.execute(f"SHOW GLOBAL STATUS WHERE Variable_name IN ({placeholders})", names)
    return {name: int(value) for name, value in cur.fetchall()}


def session_questions(conn: Any) -> int:
    cur = conn.cursor()
    cur.execute("SHOW SESSION STATUS LIKE 'Questions'")
    return int(cur.fetchone()[1])


def history_list_length(conn: Any) -> int:
    """InnoDB's purge backlog: undo records of committed transactions not yet purged."""
    cur = conn.cursor()
    cur.execute("SHOW ENGINE INNODB STATUS")
    text = cur.fetchone()[2]
    match = _HISTORY_RE.search(text)
    return int(match.group(1)) if match else -1


def server_variables(conn: Any) -> dict[str, str]:
    names = ("version", "version_comment", "innodb_flush_log_at_trx_commit",
             "innodb_buffer_pool_size", "innodb_log_file_size", "log_bin", "binlog_format",
             "sync_binlog", "transaction_isolation", "tx_isolation", "max_connections",
             "innodb_purge_threads", "performance_schema")
    cur = conn.cursor()
    placeholders = ", ".join(["%s"] * len(names))
    cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({placeholders})", names)
    return {name: str(value) for name, value in cur.fetchall()}


def server_cpu_seconds(conn: Any) -> float | None:
    """The server process's CPU seconds when it runs on this host (its pid file and
    ``/proc`` readable), else None. On a shared server it counts every client's work."""
    try:
        pid = int(Path(str(scalar(conn, "SELECT @@pid_file"))).read_text().split()[0])
    except (OSError, ValueError, IndexError, MySQLdb.Error):
        return None
    return cpu_seconds(pid)


def truncate_queue(conn: Any) -> None:
    """Empty the queue tables (fresh tables: no delete-marked rows left from before)."""
    cur = conn.cursor()
    for table in ("mysqlq_message", "mysqlq_attempt", "mysqlq_worker"):
        cur.execute(f"TRUNCATE TABLE {table}")


class ServerWatch:
    """Fails a workload whose server restarted or vanished while it ran."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.started = time.monotonic()
        self.uptime = self._uptime()

    def _uptime(self) -> int:
        try:
            return global_status(self.conn, "Uptime")["Uptime"]
        except MySQLdb.OperationalError as exc:
            raise ServerRestarted(
                f"MariaDB went away during the run ({exc}); its figures are discarded. "
                "Another session may have restarted the server: run the benchmark again."
            ) from exc

    def check(self) -> None:
        uptime = self._uptime()
        if uptime < self.uptime + (time.monotonic() - self.started) - 5:
            raise ServerRestarted(
                f"MariaDB restarted during the run (Uptime {self.uptime}s -> {uptime}s); its "
                "figures are discarded. Run the benchmark again."
            )
