"""The floor: the queue's statements through plain ``MySQLdb``, without the library.

The statements mirror ``django_mysqlq.broker`` (enqueue INSERT, CLAIM_SQL, the read by
token, the ack's DELETE and history INSERT) on the real tables, one connection, no ORM,
no Python-side bookkeeping. Every library figure is also reported as a ratio to the
matching figure here, measured in the same run.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from django_mysqlq.models import CLAIM_INDEX

from ..context import DEFAULT_QUEUE, NOOP_PAYLOAD, NOOP_TASK, Context
from ..errors import BenchError

_INSERT_HEAD = (
    "INSERT INTO mysqlq_message (queue, task_name, payload, priority, max_attempts, "
    "retry_backoff, timeout, dedup_key, enqueued_at, run_at, status, attempts, last_error) "
    "VALUES "
)
_INSERT_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), "
    "COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND), "
    "IF(COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND) > UTC_TIMESTAMP(6), "
    "'scheduled', 'ready'), 0, '')"
)
_ROW_PARAMS = [DEFAULT_QUEUE, NOOP_TASK, NOOP_PAYLOAD, 0, 1, 0.0, None, None, None, 0, None, 0]

CLAIM_SQL = f"""
UPDATE mysqlq_message FORCE INDEX ({CLAIM_INDEX})
   SET status = 'claimed', claim_token = %s, owner_connection = CONNECTION_ID(),
       owner_server_start = %s, worker_id = %s, claimed_at = UTC_TIMESTAMP(6),
       lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND,
       attempts = attempts + 1
 WHERE queue = %s AND status = 'ready'
 ORDER BY priority DESC, id
 LIMIT %s
"""
READ_SQL = """
SELECT id, queue, task_name, payload, priority, attempts, max_attempts, retry_backoff,
       timeout, enqueued_at, owner_connection
  FROM mysqlq_message WHERE claim_token = %s ORDER BY priority DESC, id
"""
_HISTORY_HEAD = (
    "INSERT INTO mysqlq_attempt (message_id, queue, task_name, attempt, outcome, priority, "
    "enqueued_at, started_at, finished_at, worker_id, host, pid, connection_id, thread, "
    "error_class, error_message, traceback, result, payload) VALUES "
)
_HISTORY_ROW = (
    "(%s, %s, %s, %s, 'succeeded', %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), %s, %s, %s, "
    "%s, %s, '', '', '', NULL, %s)"
)
SERVER_START = 0
WORKER_ID = "bench:raw"
LEASE_MICROS = 30_000_000

#: (case, rows claimed per statement, rows acked per transaction, history rows written)
CYCLES: tuple[tuple[str, int, int, bool], ...] = (
    ("claim_delete_1", 1, 1, False),
    ("claim_delete_100", 100, 100, False),
    ("claim_delete_500", 500, 500, False),
    ("claim_ack_10", 10, 20, True),
    ("claim_ack_100", 100, 20, True),
)


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    for _ in range(ctx.repeat):
        _single_inserts(ctx, sizes.raw_single_inserts)
        _single_inserts_txn(ctx, sizes.raw_single_inserts)
        _multi_inserts(ctx, sizes.raw_multi_statements)
        for case, claim, ack, history in CYCLES:
            rows = sizes.raw_cycles_one if claim == 1 else sizes.raw_cycle_rows
            _cycles(ctx, case, rows, claim, ack, history)


def _single_inserts(ctx: Context, count: int) -> None:
    cur = ctx.conn.cursor()
    cur.execute("TRUNCATE TABLE mysqlq_message")
    sql = _INSERT_HEAD + _INSERT_ROW
    started = time.perf_counter()
    for _ in range(count):
        cur.execute(sql, _ROW_PARAMS)
    elapsed = time.perf_counter() - started
    ctx.results.figure("raw", "insert_single", "rows/s", "rows/s",
                       note="autocommit, one row per statement").add(count / elapsed)


def _single_inserts_txn(ctx: Context, count: int) -> None:
    """One row per transaction, opened and closed as Django's ``atomic()`` does it."""
    conn = ctx.conn
    cur = conn.cursor()
    cur.execute("TRUNCATE TABLE mysqlq_message")
    sql = _INSERT_HEAD + _INSERT_ROW
    started = time.perf_counter()
    try:
        for _ in range(count):
            conn.autocommit(False)
            cur.execute(sql, _ROW_PARAMS)
            conn.commit()
            conn.autocommit(True)
    finally:
        conn.autocommit(True)
    elapsed = time.perf_counter() - started
    ctx.results.figure("raw", "insert_single_txn", "rows/s", "rows/s",
                       note="one row per transaction: autocommit off, INSERT, COMMIT, "
                            "autocommit on").add(count / elapsed)


def _multi_inserts(ctx: Context, statements: int) -> None:
    cur = ctx.conn.cursor()
    cur.execute("TRUNCATE TABLE mysqlq_message")
    sql = _INSERT_HEAD + ", ".join([_INSERT_ROW] * 1000) + " RETURNING id"
    params = _ROW_PARAMS * 1000
    started = time.perf_counter()
    for _ in range(statements):
        cur.execute(sql, params)
        cur.fetchall()
    elapsed = time.perf_counter() - started
    ctx.results.figure("raw", "insert_multi_1000", "rows/s", "rows/s",
                       note="autocommit, 1,000 rows per INSERT … RETURNING id"
                       ).add(statements * 1000 / elapsed)


def _cycles(ctx: Context, case: str, rows: int, claim: int, ack: int, history: bool) -> None:
    cur = ctx.conn.cursor()
    cur.execute("TRUNCATE TABLE mysqlq_message")
    cur.execute("TRUNCATE TABLE mysqlq_attempt")
    ctx.fill_ready(rows)
    moved = 0
    started = time.perf_counter()
    while True:
        token = uuid.uuid4().hex
        cur.execute(CLAIM_SQL, [token, SERVER_START, WORKER_ID, LEASE_MICROS, DEFAULT_QUEUE,
                                claim])
        if cur.rowcount == 0:
            break
        cur.execute(READ_SQL, [token])
        claimed = cur.fetchall()
        for start in range(0, len(claimed), ack):
            _ack(cur, claimed[start:start + ack], token, history)
        moved += len(claimed)
    elapsed = time.perf_counter() - started
    if moved != rows:
        raise BenchError(f"raw {case}: moved {moved} of {rows} rows")
    note = (f"claim {claim}, read, then per {min(ack, claim)}: DELETE … RETURNING + history "
            "INSERT in one transaction" if history else f"claim {claim}, read, DELETE by id list")
    ctx.results.figure("raw", case, "rows/s", "rows/s", note=note).add(rows / elapsed)


def _ack(cur: Any, rows: Any, token: str, history: bool) -> None:
    ids = [row[0] for row in rows]
    marks = ", ".join(["%s"] * len(ids))
    if not history:
        cur.execute(f"DELETE FROM mysqlq_message WHERE id IN ({marks})", ids)
        return
    cur.execute("BEGIN")
    cur.execute(f"DELETE FROM mysqlq_message WHERE id IN ({marks}) AND claim_token IN (%s) "
                "RETURNING id", [*ids, token])
    cur.fetchall()
    params: list[Any] = []
    for row in rows:
        params += [row[0], row[1], row[2], row[5], row[4], row[9], WORKER_ID, "bench", 1,
                   row[10], "raw", row[3]]
    cur.execute(_HISTORY_HEAD + ", ".join([_HISTORY_ROW] * len(rows)), params)
    cur.execute("COMMIT")
