"""Plain ``MySQLdb`` connections for the harness: set-up, the process list, KILL, restart.

Each call opens its own short-lived connection, so a restarted server never leaves the
harness holding a dead one.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import MySQLdb
from django.conf import settings

logger = logging.getLogger("bench.chaos")

TABLES = ("mysqlq_message", "mysqlq_attempt", "mysqlq_worker", "chaos_enqueued",
          "chaos_execution", "chaos_effect")


class HarnessError(RuntimeError):
    """The harness itself could not do its job (not a finding about the queue)."""


def _conf() -> dict[str, Any]:
    return dict(settings.DATABASES["default"])


def database_name() -> str:
    return str(_conf()["NAME"])


@contextlib.contextmanager
def connect(database: bool = True, port: int | None = None) -> Iterator[Any]:
    """A connection to the chaos database's server (``port``: another node of a cluster)."""
    conf = _conf()
    args: dict[str, Any] = {
        "host": conf["HOST"], "port": port or int(conf["PORT"]), "user": conf["USER"],
        "password": conf["PASSWORD"], "charset": "utf8mb4", "autocommit": True,
        "connect_timeout": 5, "read_timeout": 30, "write_timeout": 30,
    }
    if database:
        args["database"] = conf["NAME"]
    try:
        conn = MySQLdb.connect(**args)
    except MySQLdb.OperationalError as exc:
        raise HarnessError(
            f"Can't connect to MariaDB at {conf['HOST']}:{args['port']} as {conf['USER']} "
            f"({exc}). Start the server or set MYSQLQ_CHAOS_HOST/PORT/USER/PASSWORD.") from exc
    try:
        yield conn
    finally:
        with contextlib.suppress(MySQLdb.Error):
            conn.close()


def create_database(afresh: bool = False) -> None:
    """Create the run's database; ``afresh`` drops it first, so nothing an earlier run (of
    another version: tables, migration records) left can matter."""
    with connect(database=False) as conn:
        if afresh:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{database_name()}`")
        conn.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{database_name()}` CHARACTER SET utf8mb4")


def foreign_connections() -> list[tuple[int, str]]:
    """``(id, host)`` of other connections to the chaos database (a run already going?)."""
    with connect() as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT ID, HOST FROM information_schema.PROCESSLIST "
                       "WHERE DB = %s AND ID <> CONNECTION_ID()", [database_name()])
        return [(int(row[0]), str(row[1])) for row in cursor.fetchall()]


def empty_tables() -> None:
    with connect() as conn:
        cursor = conn.cursor()
        for table in TABLES:
            cursor.execute(f"TRUNCATE TABLE {table}")


def connections_by_port(server_port: int | None = None) -> dict[int, int]:
    """Client TCP port -> connection id, for connections to the chaos database (on the
    node listening on ``server_port``: process lists are per node)."""
    with connect(port=server_port) as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT ID, HOST FROM information_schema.PROCESSLIST "
                       "WHERE DB = %s AND ID <> CONNECTION_ID()", [database_name()])
        found: dict[int, int] = {}
        for connection_id, host in cursor.fetchall():
            _, _, port = str(host).rpartition(":")
            if port.isdigit():
                found[int(port)] = int(connection_id)
        return found


def kill_connections(ids: list[int], server_port: int | None = None) -> list[int]:
    """``KILL CONNECTION`` each id (on that node); return those the server still knew."""
    killed = []
    with connect(port=server_port) as conn:
        cursor = conn.cursor()
        for connection_id in ids:
            try:
                cursor.execute("KILL CONNECTION %s", [connection_id])
                killed.append(connection_id)
            except MySQLdb.OperationalError as exc:
                if exc.args[0] != 1094:  # unknown thread id: it ended by itself
                    raise
    return killed


def queue_backlog() -> dict[str, int]:
    """Unfinished messages by status."""
    with connect() as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT status, COUNT(*) FROM mysqlq_message GROUP BY status")
        return {str(status): int(count) for status, count in cursor.fetchall()}


def claims_by_worker() -> dict[str, int]:
    """Claimed messages per worker id."""
    with connect() as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT worker_id, COUNT(*) FROM mysqlq_message "
                       "WHERE status = 'claimed' GROUP BY worker_id")
        return {str(worker): int(count) for worker, count in cursor.fetchall()}


def lock_head_row(seconds: float) -> tuple[int, float, float] | None:
    """Lock the oldest ready message (or, if none is ready, the oldest scheduled one)
    ``FOR UPDATE`` on a connection of its own, for ``seconds`` (a background thread holds
    it); ``(id, from, until)``, or None if nothing is waiting. A stranger's long
    transaction: the queue must keep flowing around it."""
    answer: queue.Queue[tuple[int, float, float] | None] = queue.Queue()

    def hold() -> None:
        told = False
        try:
            with connect() as conn:
                cursor = conn.cursor()
                row = None
                for status in ("ready", "scheduled"):  # a drained queue still has delays
                    cursor.execute("SELECT id FROM mysqlq_message WHERE status = %s "
                                   "ORDER BY id LIMIT 1", [status])
                    row = cursor.fetchone()
                    if row is not None:
                        break
                if row is not None:
                    cursor.execute("START TRANSACTION")
                    cursor.execute("SELECT id FROM mysqlq_message FORCE INDEX (PRIMARY) "
                                   "WHERE id = %s AND status = %s FOR UPDATE", [row[0], status])
                    if cursor.fetchone() is not None:
                        at = time.time()
                        answer.put((int(row[0]), at, at + seconds))
                        told = True
                        time.sleep(seconds)
                    cursor.execute("ROLLBACK")
        except MySQLdb.Error as exc:
            logger.warning("The locked-row action failed (%s).", exc)
        finally:
            if not told:
                answer.put(None)

    threading.Thread(target=hold, name="chaos-locked-row", daemon=True).start()
    try:
        return answer.get(timeout=15)
    except queue.Empty:
        return None


def topic_backlog() -> dict[str, int]:
    """What the topics' groups have not yet turned into deliveries: rows without an
    offset, and per group the offsets past its position."""
    with connect() as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT COUNT(*) FROM mysqlq_topic_message WHERE msg_offset IS NULL")
        backlog = {"unsequenced": int(cursor.fetchone()[0])}
        cursor.execute("SELECT g.group_name, t.last_offset - g.position FROM "
                       "mysqlq_topic_group g JOIN mysqlq_topic t ON t.name = g.topic")
        for group, behind in cursor.fetchall():
            backlog[f"group {group}"] = int(behind)
        return {key: value for key, value in backlog.items() if value}
