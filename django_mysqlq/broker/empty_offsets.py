"""Offsets that hold no message, behind a group's topic's last offset.

A group whose pump reads nothing after its position while its topic's ``last_offset``
is past it: those offsets hold no message and never will (offsets are only given past
the last one). Their messages were deleted (by hand, or by retention that does not wait
for groups), or the ``last_offset`` was raised by hand. Left there, the group pumped
nothing at every round with a lag that never drained, a ``--burst`` member never ended,
and its new messages waited for another reader to sequence them (a group behind leaves
that to others). The pump moves such a group to the last offset (``deliveries``).

The last offset and the look for a message up to it are one statement (one read view:
a stamp commits its messages with the last offset it moves), so a round that commits
meanwhile is seen whole or not at all. The pump's read before it is not trusted alone,
nor is one answer: a producer's wake-up (``KILL QUERY``) landing in a subquery can make
MariaDB answer NULL (see ``deliveries.pump_claiming``), so only a plain 0, confirmed by
a second look, says the offsets are empty.
"""

from __future__ import annotations

from typing import Any

from .topics import OFFSET_INDEX, TOPIC_MESSAGE_TABLE, TOPIC_TABLE

#: The topic's last offset, and whether a message has an offset after a position up to
#: it (``EXISTS``: 0 or 1, or NULL when a wake-up cut it short).
EMPTY_BEHIND_SQL = (
    f"SELECT t.last_offset, EXISTS(SELECT 1 FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
    f"({OFFSET_INDEX}) WHERE topic = t.name AND msg_offset > %s "
    f"AND msg_offset <= t.last_offset) FROM {TOPIC_TABLE} t WHERE t.name = %s"
)
#: The same look alone, asked again before the answer is used.
ANY_UP_TO_SQL = (f"SELECT 1 FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
                 "WHERE topic = %s AND msg_offset > %s AND msg_offset <= %s LIMIT 1")


def empty_up_to_last(cursor: Any, topic: str, position: int) -> int | None:
    """The topic's last offset when it is past ``position`` and no message has an offset
    between; else None (not behind, a message there, or no plain answer)."""
    cursor.execute(EMPTY_BEHIND_SQL, [position, topic])
    row = cursor.fetchone()
    if row is None or row[0] is None or row[1] is None:
        return None
    last, found = int(row[0]), int(row[1])
    if last <= position or found != 0:
        return None  # (not behind, or stamped since the pump's read: it takes them next)
    cursor.execute(ANY_UP_TO_SQL, [topic, position, last])
    return None if cursor.fetchone() is not None else last
