"""A topic's kept offsets, checked: ``mysqlq_topic.first_offset`` as readers may trust it.

Retention deletes a prefix of the offsets and moves ``first_offset`` past it in the same
transaction, so what is kept is ``first_offset … last_offset``, and ``first_offset`` is
1 to ``last_offset + 1`` (that one: nothing kept). A value outside, or one that says
nothing is kept while messages are (changed by hand), made its readers misbehave: a new
``earliest`` group and a reset to the earliest went past ``last_offset`` (the group then
skipped the offsets between), lag left out the messages not pumped, replay and reset
refused kept offsets, retention stopped. Readers take the lowest offset a kept message
has instead (one index dive, only when the value claims nothing is kept or is below 1),
and the error is logged once per topic and value; retention writes the value back.
"""

from __future__ import annotations

import threading
from typing import Any

from .base import logger
from .topics import OFFSET_INDEX, TOPIC_MESSAGE_TABLE, TOPIC_TABLE

TOPIC_BOUNDS_SQL = f"SELECT first_offset, last_offset FROM {TOPIC_TABLE} WHERE name = %s"
#: The same under a shared lock, for a writer that trusts ``first_offset`` until it
#: commits (a reset): a retention batch moving it waits, or is waited for.
TOPIC_BOUNDS_LOCKING_SQL = TOPIC_BOUNDS_SQL + " LOCK IN SHARE MODE"
#: Put back a first_offset that can't be true (unless it changed meanwhile).
REPAIR_FIRST_SQL = (f"UPDATE {TOPIC_TABLE} SET first_offset = %s "
                    "WHERE name = %s AND first_offset = %s")
#: The lowest offset a kept message has: one row of the (topic, offset) index, past its
#: NULLs (``MIN()`` with the same condition is planned as a range read: EXPLAIN).
LOWEST_KEPT_SQL = (f"SELECT msg_offset FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
                   f"({OFFSET_INDEX}) WHERE topic = %s AND msg_offset IS NOT NULL "
                   "ORDER BY msg_offset LIMIT 1")

#: (topic, first_offset) already logged by this process.
_said: set[tuple[str, int]] = set()
_said_lock = threading.Lock()


def checked_first(cursor: Any, topic: str, first: int, last: int) -> int:
    """``first`` (the topic's ``first_offset``) when it can be true; else the lowest
    offset a kept message has (``last + 1`` when none is), the error logged once."""
    if 1 <= first <= last:
        return first
    cursor.execute(LOWEST_KEPT_SQL, [topic])
    row = cursor.fetchone()
    kept = last + 1 if row is None else min(int(row[0]), last + 1)
    if kept != first:
        _say(topic, first, last, kept)
    return kept


def kept_bounds(cursor: Any, topic: str, repair: bool = False,
                locking: bool = False) -> tuple[int, int] | None:
    """The topic's first kept (checked) and last offsets; None when it has no row. With
    ``repair`` (retention), a first_offset that can't be true is written back as the
    lowest kept offset; with ``locking`` (inside a transaction), the topic row is read
    under a shared lock, held to the commit."""
    cursor.execute(TOPIC_BOUNDS_LOCKING_SQL if locking else TOPIC_BOUNDS_SQL, [topic])
    row = cursor.fetchone()
    if row is None:
        return None
    stored, last = int(row[0]), int(row[1])
    first = checked_first(cursor, topic, stored, last)
    if repair and first != stored:
        cursor.execute(REPAIR_FIRST_SQL, [first, topic, stored])
    return first, last


def _say(topic: str, first: int, last: int, kept: int) -> None:
    with _said_lock:
        if (topic, first) in _said:
            return
        _said.add((topic, first))
    kept_words = (f"its lowest kept offset, {kept}" if kept <= last
                  else f"{kept}: it keeps no message")
    logger.error(
        "Topic %r: its first_offset in mysqlq_topic is %d, which can't be true with its "
        "last_offset %d and the messages it keeps (changed by hand?): first_offset is 1 to "
        "last_offset + 1, and no kept message is below it. Groups starting at the earliest, "
        "resets, replays, lag and retention go by %s instead; retention writes it back at "
        "its next batch.", topic, first, last, kept_words)
