"""Why a consumer group's pump can't go on, kept on the group's row for operators.

A member whose pump for a group keeps failing (a row changed by hand, a value out of
range), or stops before a message it can't deliver, says so in its log; the lag it causes
shows in ``queuetopic groups``, the admin and the dashboard, so the cause is written
beside it (``pump_problem``, ``pump_problem_at``). The pump's own move of the position
clears it (``deliveries.MOVE_SQL``), and so does an operator's reset; a member whose look
finds the group with every sequenced message clears it too (``clear_pump_problem``: a
row fixed by hand may leave nothing to pump until the next publish).

The row is taken with ``SKIP LOCKED``, as the pump takes it: a row held by a pump or by a
stranger is not waited for (the note is then left for the member's next problem).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import default_alias, in_transaction
from .deliveries import GROUP_TABLE

#: Longest note kept (the error's text is cut to it).
PROBLEM_MAX_CHARS = 2000
LOCK_ROW_SQL = (f"SELECT id, pump_problem FROM {GROUP_TABLE} WHERE topic = %s AND group_name = %s"
                " FOR UPDATE SKIP LOCKED")
CLEAR_SQL = (f"UPDATE {GROUP_TABLE} SET pump_problem = '', pump_problem_at = NULL"
             " WHERE id = %s")
NOTE_SQL = (f"UPDATE {GROUP_TABLE} SET pump_problem = %s, pump_problem_at = UTC_TIMESTAMP(6)"
            " WHERE id = %s")


def note_pump_problem(topic: str, group: str, problem: str, alias: str | None = None) -> bool:
    """Write ``problem`` on the group's row (its time is when it was first seen: a note
    already saying the same is left as it is). False when the row was held (not written)
    or is gone."""
    text = problem[:PROBLEM_MAX_CHARS]

    def write(cursor: Any, row_id: int, note: str) -> bool:
        if note != text:
            cursor.execute(NOTE_SQL, [text, row_id])
        return True

    return _on_group_row(topic, group, alias, write)


def clear_pump_problem(topic: str, group: str, alias: str | None = None) -> bool:
    """Take the note off the group's row (its pump can go on again). True when a note was
    there and is gone; False when there was none, or the row was held (left for the
    member's next look)."""

    def clear(cursor: Any, row_id: int, note: str) -> bool:
        if not note:
            return False
        cursor.execute(CLEAR_SQL, [row_id])
        return True

    return _on_group_row(topic, group, alias, clear)


def _on_group_row(topic: str, group: str, alias: str | None,
                  change: Callable[[Any, int, str], bool]) -> bool:
    """``change(cursor, row id, its note)`` on the group's row, taken ``SKIP LOCKED``, in
    one transaction; False when the row is held or gone."""

    def body(cursor: Any) -> bool:
        cursor.execute(LOCK_ROW_SQL, [topic, group])
        row = cursor.fetchone()
        return row is not None and change(cursor, row[0], row[1])

    return in_transaction(alias or default_alias(), body)
