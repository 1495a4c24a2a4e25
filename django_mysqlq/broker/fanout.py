"""Bulk enqueue from many processes at once (Spark executors): keyed rows, none twice.

Executors are separate processes with no Django connection of their own: these
functions take a plain DB-API (``MySQLdb``) connection. The rows are enqueue's own
(:mod:`.enqueue`'s row templates, cut to the packet by :mod:`.packets`), written with
``INSERT IGNORE`` so that a row whose ``dedup_key`` is already pending is skipped, not an
error: a retried or speculative Spark task, or a re-run of the same input, writes each
message once. Each statement is its own short transaction, and is rolled back if the
server turned anything but a duplicate key into a warning (what ``IGNORE`` also hides).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..messages import NewMessage
from .base import MESSAGE_TABLE
from .enqueue import _INSERT_COLUMNS, _chunks, _row
from .packets import MAX_PACKET_SQL, PACKET_HEADROOM, STATEMENT_BYTES

INSERT_IGNORE_HEAD = f"INSERT IGNORE INTO {MESSAGE_TABLE} ({_INSERT_COLUMNS}) VALUES "
#: What a skipped duplicate leaves in ``SHOW WARNINGS``; any other warning is an error.
DUPLICATE_ENTRY = 1062
SHOW_WARNINGS_SQL = "SHOW WARNINGS"
READ_COMMITTED_SQL = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"


class FanoutRefused(RuntimeError):
    """The server refused (or silently changed) a row: nothing of that statement stays."""


def prepare(conn: Any) -> int:
    """Make a fresh connection the broker's (READ COMMITTED, no autocommit); return the
    bytes a statement may take on it."""
    cursor = conn.cursor()
    cursor.execute(READ_COMMITTED_SQL)
    cursor.execute(MAX_PACKET_SQL)
    packet = int(cursor.fetchone()[0])
    conn.autocommit(False)
    return min(STATEMENT_BYTES, max(packet // 2, packet - PACKET_HEADROOM))


def check_warnings(conn: Any, skipped: int) -> None:
    """Raise if the last statement left warnings other than ``skipped`` duplicates."""
    if conn.warning_count() <= skipped:
        return
    cursor = conn.cursor()
    cursor.execute(SHOW_WARNINGS_SQL)
    other = [row for row in cursor.fetchall() if int(row[1]) != DUPLICATE_ENTRY]
    if other:
        raise FanoutRefused(f"The database changed or refused rows of a bulk enqueue: "
                            f"{other[:3]}. Nothing of that statement was kept.")


def insert_new(conn: Any, messages: Sequence[NewMessage], room: int) -> int:
    """Insert messages whose dedup key is not pending yet; return how many were new.

    ``conn`` is a connection :func:`prepare` made ready; ``room`` what it returned.
    Each multi-row statement commits on its own.
    """
    inserted = 0
    cursor = conn.cursor()
    for chunk in _chunks(messages, room):
        rows: list[str] = []
        params: list[Any] = []
        for message in chunk:
            row, row_params = _row(message)
            rows.append(row)
            params.extend(row_params)
        try:
            cursor.execute(INSERT_IGNORE_HEAD + ", ".join(rows), params)
            added = int(cursor.rowcount)
            check_warnings(conn, len(chunk) - added)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        inserted += added
    return inserted
