"""Bulk enqueue from many processes at once (Spark executors): keyed rows, none twice.

Executors are separate processes with no Django connection of their own: these
functions take a plain DB-API (``MySQLdb``) connection. The rows are enqueue's own
(:mod:`.enqueue`'s row templates, cut to the packet as :mod:`.packets` does), written with
``INSERT IGNORE`` so that a row whose ``dedup_key`` is already pending is skipped, not an
error: a retried or speculative Spark task, or a re-run of the same input, writes each
message once. Each statement is its own short transaction, and is rolled back if the
server turned anything but a duplicate key into a warning (what ``IGNORE`` also hides).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..messages import NewMessage
from .base import MESSAGE_TABLE
from .enqueue import _INSERT_COLUMNS, _row
from .isolation import SESSION_READ_COMMITTED_SQL
from .packets import MAX_PACKET_SQL, PACKET_HEADROOM, STATEMENT_BYTES

INSERT_IGNORE_HEAD = f"INSERT IGNORE INTO {MESSAGE_TABLE} ({_INSERT_COLUMNS}) VALUES "
#: What a skipped duplicate leaves in ``SHOW WARNINGS``; any other warning is an error.
DUPLICATE_ENTRY = 1062
SHOW_WARNINGS_SQL = "SHOW WARNINGS"


class FanoutRefused(RuntimeError):
    """The server refused (or silently changed) a row: nothing of that statement stays."""


def prepare(conn: Any) -> int:
    """Make a fresh connection the broker's (READ COMMITTED, no autocommit); return the
    bytes a statement may take on it."""
    cursor = conn.cursor()
    cursor.execute(SESSION_READ_COMMITTED_SQL)
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


#: Stand-ins for a row's payload and key in its template (escaped values never hold NUL).
_PAYLOAD_MARK, _KEY_MARK = "\x00payload\x00", "\x00key\x00"
#: Rows per multi-row statement at most (as enqueue's INSERT_CHUNK).
ROWS_PER_STATEMENT = 1000


def row_template(conn: Any, like: NewMessage) -> tuple[bytes, bytes, bytes]:
    """Enqueue's VALUES row for messages like ``like`` with every value but the payload
    and dedup key escaped once, as the text before, between and after those two."""
    row, params = _row(dataclasses.replace(like, payload=_PAYLOAD_MARK, dedup_key=_KEY_MARK))
    values = [value if value in (_PAYLOAD_MARK, _KEY_MARK) else conn.literal(value).decode()
              for value in params]
    before, rest = (row % tuple(values)).split(_PAYLOAD_MARK)
    between, after = rest.split(_KEY_MARK)
    return before.encode(), between.encode(), after.encode()


def insert_encoded(conn: Any, like: NewMessage, rows: Sequence[tuple[str, str]],
                   room: int) -> int:
    """Insert messages like ``like``, one per ``(payload, dedup key)``, skipping keys that
    are pending already; return how many were new.

    The fast path of a bulk enqueue: only the two values that differ are escaped per row.
    ``conn`` is a connection :func:`prepare` made ready; ``room`` what it returned. Each
    multi-row statement commits on its own.
    """
    before, between, after = row_template(conn, like)
    head = (INSERT_IGNORE_HEAD).encode()
    literal = conn.string_literal
    inserted = 0
    cursor = conn.cursor()
    statement: list[bytes] = []
    size = len(head)

    def flush() -> int:
        try:
            cursor.execute(head + b", ".join(statement))
            added = int(cursor.rowcount)
            check_warnings(conn, len(statement) - added)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        return added

    for payload, key in rows:
        row = b"".join((before, literal(payload.encode()), between, literal(key.encode()),
                        after))
        if statement and (len(statement) >= ROWS_PER_STATEMENT or size + len(row) > room):
            inserted += flush()
            statement, size = [], len(head)
        statement.append(row)
        size += len(row) + 2
    if statement:
        inserted += flush()
    return inserted
