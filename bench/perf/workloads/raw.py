"""The floor: the queue's statements through plain ``MySQLdb``, without the library.

The statement texts are the broker's own (its enqueue INSERT, the claim, the read by
token, the ack's DELETE … RETURNING and history INSERT), imported, so the floor follows
the library when a statement changes; they run on the real tables, one connection, no
ORM, no Python-side bookkeeping. Every library figure is also reported as a ratio to the
matching figure here, measured in the same run.
"""

from __future__ import annotations

import datetime as dt
import importlib
import time
import uuid
from typing import Any

from django_mysqlq import broker
from django_mysqlq.broker import history as history_module
from django_mysqlq.models import Outcome

from ..context import DEFAULT_QUEUE, NOOP_PAYLOAD, NOOP_TASK, Context
from ..errors import BenchError

# By path: the package re-exports functions named like these two modules.
claim_module = importlib.import_module("django_mysqlq.broker.claim")
enqueue_module = importlib.import_module("django_mysqlq.broker.enqueue")
settle_module = importlib.import_module("django_mysqlq.broker.settle")

#: The library's enqueue statements and the row it writes for a message ready at once.
_INSERT = enqueue_module.INSERT_SQL
_INSERT_RETURNING = enqueue_module.INSERT_RETURNING_SQL
_INSERT_ROW = enqueue_module._INSERT_ROW_NOW_NO_KEY
#: queue, task, payload, priority, max_attempts, backoff, timeout
_ROW_PARAMS = [DEFAULT_QUEUE, NOOP_TASK, NOOP_PAYLOAD, 0, 1, 0.0, None]


def claim_statement(ctx: Context) -> str:
    """The broker's claim, with the queue column's collation read as the broker reads it."""
    cur = ctx.conn.cursor()
    cur.execute(claim_module.QUEUE_COLLATION_SQL)
    row = cur.fetchone()
    return broker.claim_sql_for(row[0] if row else None)

READ_SQL = broker.READ_CLAIMED_SQL
_HISTORY_HEAD = history_module.ATTEMPT_INSERT_HEAD
_HISTORY_ROW = history_module.ATTEMPT_ROW
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
    sql = _INSERT.format(rows=_INSERT_ROW)
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
    sql = _INSERT.format(rows=_INSERT_ROW)
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
    sql = _INSERT_RETURNING.format(rows=", ".join([_INSERT_ROW] * 1000))
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
    claim_sql = claim_statement(ctx)
    moved = 0
    started = time.perf_counter()
    deadline = started + ctx.sizes.raw_cycle_seconds
    while time.perf_counter() < deadline:
        token = uuid.uuid4().hex
        cur.execute(claim_sql, [token, True, SERVER_START, WORKER_ID, LEASE_MICROS,
                                DEFAULT_QUEUE, claim])
        if cur.rowcount == 0:
            break
        cur.execute(READ_SQL, [token])
        claimed = cur.fetchall()
        for start in range(0, len(claimed), ack):
            _ack(cur, claimed[start:start + ack], token, history)
        moved += len(claimed)
    elapsed = time.perf_counter() - started
    stopped = time.perf_counter() >= deadline and moved < rows
    if moved != rows and not stopped:
        raise BenchError(f"raw {case}: moved {moved} of {rows} rows")
    note = (f"claim {claim}, read, then per {min(ack, claim)}: DELETE … RETURNING + history "
            "INSERT in one transaction" if history else f"claim {claim}, read, DELETE by id list")
    fig = ctx.results.figure("raw", case, "rows/s", "rows/s", note=note)
    fig.add(moved / elapsed, rows=rows, moved=moved, stopped_early=stopped)
    cut = sum(1 for d in fig.details if d["stopped_early"])
    if cut:
        fig.note = (f"{note}; STOPPED after {ctx.sizes.raw_cycle_seconds:g}s in {cut} "
                    "repeat(s): rate from the rows moved")


def _ack(cur: Any, rows: Any, token: str, history: bool) -> None:
    ids = [row[0] for row in rows]
    marks = ", ".join(["%s"] * len(ids))
    if not history:
        cur.execute(f"DELETE FROM mysqlq_message WHERE id IN ({marks})", ids)
        return
    cur.execute("BEGIN")
    pairs, pair_params = settle_module.pairs_table([(message_id, token) for message_id in ids])
    cur.execute(settle_module.DELETE_PAIRS_SQL.format(pairs=pairs), pair_params)
    started_at = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    params: list[Any] = []
    for row in rows:  # the columns of history_module.attempt_params, in its order
        params += [row[0], row[1], row[2], row[5], Outcome.SUCCEEDED.value, row[4], row[9],
                   started_at, WORKER_ID, "bench", 1, row[10], "raw", "", "", "", None,
                   row[3]]
    cur.execute(_HISTORY_HEAD + ", ".join([_HISTORY_ROW] * len(rows)), params)
    cur.execute("COMMIT")
