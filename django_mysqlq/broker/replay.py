"""Replay in bulk (the pipeline's ``replay``): copies of finished messages, each linked
to its original, and never two copies of one original.

Like :mod:`.fanout` these functions take a plain DB-API connection (Spark executors
have no Django one). In one short transaction per statement's worth of rows they skip
originals that history already shows replayed (``replayed_from``) or that are waiting or
running again (requeued since they were picked), insert the copies
with the key ``replay:<original id>`` (``INSERT IGNORE``: a copy of the same original
pending from a concurrent or retried run is skipped), and write one ``replayed`` history
row per copy inserted, naming its original: the admin's trace of the copy shows
"replayed from #N", as an operator's replay does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..messages import NewMessage
from ..models import Outcome
from .base import ATTEMPT_TABLE, MESSAGE_TABLE, placeholders
from .enqueue import INSERT_ROW_BYTES, _row
from .fanout import INSERT_IGNORE_HEAD, check_warnings
from .operate import Operator
from .packets import escaped_size, split_by_size

#: Originals per transaction (bounds the IN lists and what a failed statement redoes).
REPLAY_CHUNK = 500
KEY_PREFIX = "replay:"

ALREADY_REPLAYED_SQL = f"""
SELECT DISTINCT replayed_from FROM {ATTEMPT_TABLE} WHERE replayed_from IN ({{ids}})
"""
#: Originals waiting or running again (requeued since the driver picked them).
LIVE_ORIGINALS_SQL = f"""
SELECT id FROM {MESSAGE_TABLE} WHERE id IN ({{ids}}) AND status <> 'dead'
"""
#: MariaDB returns the rows it inserted (not the ones IGNORE skipped).
INSERT_COPIES_RETURNING = " RETURNING id, dedup_key"
REPLAY_HISTORY_HEAD = f"""
INSERT INTO {ATTEMPT_TABLE}
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload, actor, replayed_from)
VALUES """
REPLAY_HISTORY_ROW = (
    f"(%s, %s, %s, 0, '{Outcome.REPLAYED.value}', %s, UTC_TIMESTAMP(6), NULL, "
    "UTC_TIMESTAMP(6), '', %s, %s, NULL, '', '', %s, '', NULL, '', %s, %s)"
)


@dataclasses.dataclass(frozen=True)
class ReplayCopy:
    """One message to enqueue again: the copy, and where it came from."""

    message: NewMessage
    #: The original's message id.
    original: int
    #: The history row the copy's arguments were read from.
    source_row: int


def replay_key(original: int) -> str:
    """The dedup key of a copy: one pending copy per original."""
    return f"{KEY_PREFIX}{original}"


def replay_note(original: int, source_row: int) -> str:
    return f"replayed from #{original} (history row {source_row})"


def _skip_replayed(cursor: Any, copies: Sequence[ReplayCopy]) -> list[ReplayCopy]:
    """The copies whose original was neither replayed before nor is live again (an
    operator requeued it: a copy would run it twice)."""
    originals = sorted({copy.original for copy in copies})
    done = set()
    for sql in (ALREADY_REPLAYED_SQL, LIVE_ORIGINALS_SQL):
        cursor.execute(sql.format(ids=placeholders(len(originals))), originals)
        done |= {int(row[0]) for row in cursor.fetchall()}
    return [copy for copy in copies if copy.original not in done]


def _insert_copies(conn: Any, cursor: Any, copies: Sequence[ReplayCopy]) -> dict[int, int]:
    """Insert the copies; return ``{original: new message id}`` of those inserted."""
    if "mariadb" in conn.get_server_info().lower():
        rows, params = [], []
        for copy in copies:
            row, row_params = _row(copy.message)
            rows.append(row)
            params.extend(row_params)
        cursor.execute(INSERT_IGNORE_HEAD + ", ".join(rows) + INSERT_COPIES_RETURNING, params)
        new = {int(str(key)[len(KEY_PREFIX):]): int(message_id)
               for message_id, key in cursor.fetchall()}
        check_warnings(conn, len(copies) - len(new))
        return new
    new = {}
    for copy in copies:  # MySQL has no INSERT … RETURNING: one by one, to learn each id
        row, row_params = _row(copy.message)
        cursor.execute(INSERT_IGNORE_HEAD + row, row_params)
        if cursor.rowcount:
            new[copy.original] = int(cursor.lastrowid)
        check_warnings(conn, 1 - int(cursor.rowcount))
    return new


def insert_replays(conn: Any, copies: Sequence[ReplayCopy], room: int,
                   operator: Operator) -> int:
    """Enqueue copies not replayed before; return how many were inserted.

    ``conn`` and ``room`` come from :func:`.fanout.prepare`.
    """
    inserted = 0
    cursor = conn.cursor()
    sizes = [escaped_size(copy.message.payload) + INSERT_ROW_BYTES
             + 4 * (len(copy.message.queue) + len(copy.message.task_name) + 40)
             for copy in copies]
    for chunk in split_by_size(copies, sizes, room, REPLAY_CHUNK):
        try:
            fresh = _skip_replayed(cursor, chunk)
            new = _insert_copies(conn, cursor, fresh) if fresh else {}
            if new:
                rows, params = [], []
                for copy in fresh:
                    if copy.original not in new:
                        continue
                    message = copy.message
                    rows.append(REPLAY_HISTORY_ROW)
                    params.extend([new[copy.original], message.queue, message.task_name,
                                   message.priority, operator.host[:255], operator.pid,
                                   replay_note(copy.original, copy.source_row),
                                   operator.name[:200], copy.original])
                cursor.execute(REPLAY_HISTORY_HEAD + ", ".join(rows), params)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()
        inserted += len(new)
    return inserted
