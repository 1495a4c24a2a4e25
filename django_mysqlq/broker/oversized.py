"""The pump's and the broadcast readers' guard against a stored message too big.

Publish refuses a payload whose delivery would not fit one statement under the server's
``max_allowed_packet``, but a row can still be there: written by hand, by an older
version, or before the server's packet was lowered. Its delivery INSERT would fail (error
1153, the server then closing the connection) in every round of every group of its
topic, and the worker's whole loop with it. So the pump reads each message's size with
it (the payload itself only when it could fit: a row past the packet can't even be
read), makes the deliveries of the messages before such a row, and stops there: the
group stays at the offset before it until the server's packet is raised or an operator
moves the group past it (``queuetopic reset``).

A broadcast reader reads the same way (:func:`read_after`). It used to read such a row
whole: the driver takes rows far past the server's packet (measured: 40 MiB under a
16 MiB packet), up to its own limit (1 GiB), past which the read failed at every poll
and held the reader there for good, its other topics too; below it, all of it in memory,
for a message no group of the topic can get. It now gets the message without its
payload and skips it, logged (nothing is retried for a broadcast).

A broadcast read is bounded by bytes as well as by count: it looks at the sizes first
(:data:`READ_SIZES_SQL`, no payload) and reads the payloads of the first messages that fit
the caller's budget. It used to take its 500 messages whatever their size: 500 MB of
payloads at the default ``MAX_PAYLOAD_BYTES`` (1 MB), gigabytes where it was raised near
the server's packet, all in the worker's memory at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..messages import NewMessage
from .base import connection_for, default_alias
from .enqueue import sent_size
from .packets import row_room
from .topics import OFFSET_INDEX, TOPIC_MESSAGE_TABLE

#: The pump's read: the sequenced messages after a position
#: with each one's size in bytes, the payload NULL where it is longer than the room one
#: row has.
PUMP_READ_SQL = (
    "SELECT msg_offset, msg_key, IF(LENGTH(payload) <= %s, payload, NULL), published_at, "
    f"LENGTH(payload) FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
    "WHERE topic = %s AND msg_offset > %s ORDER BY msg_offset LIMIT %s"
)

#: A broadcast reader's first look: the offsets after a position with each payload's
#: size, no payload (the sizes decide how many of them one read takes).
READ_SIZES_SQL = (
    f"SELECT msg_offset, LENGTH(payload) FROM {TOPIC_MESSAGE_TABLE} "
    f"FORCE INDEX ({OFFSET_INDEX}) WHERE topic = %s AND msg_offset > %s "
    "ORDER BY msg_offset LIMIT %s"
)
#: Then those messages: ``PUMP_READ_SQL`` up to the last offset that fits, at most as many
#: rows as the look counted (a row changed between the two gets the same room guard).
READ_UP_TO_SQL = (
    "SELECT msg_offset, msg_key, IF(LENGTH(payload) <= %s, payload, NULL), published_at, "
    f"LENGTH(payload) FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX}) "
    "WHERE topic = %s AND msg_offset > %s AND msg_offset <= %s ORDER BY msg_offset LIMIT %s"
)


class Oversized(NamedTuple):
    """A message whose delivery can't be inserted: the group stops before it."""

    offset: int
    #: Bytes its delivery row would take in a statement (or its payload's, unread).
    size: int
    #: Bytes one row may take under the server's packet.
    room: int

    def describe(self, topic: str, group: str) -> str:
        return (
            f"Group {group!r} of topic {topic!r} stops before offset {self.offset}: the "
            f"message's delivery takes {self.size} bytes in one statement, and the server's "
            f"max_allowed_packet leaves {self.room} for one row (the messages before it were "
            "delivered). Raise max_allowed_packet on the server (and restart the workers), "
            "or skip the message: manage.py queuetopic reset "
            f"{group} --topic {topic} --to-offset {self.offset + 1}")


class Fitting(NamedTuple):
    """What of a pump's read goes into deliveries."""

    #: The rows read by ``PUMP_READ_SQL`` before the first too big.
    rows: list[Sequence[Any]]
    #: Their deliveries.
    messages: list[NewMessage]
    #: Bytes each delivery's row takes in a statement (``enqueue.sent_size``): the
    #: INSERT splits by them without measuring each payload again.
    sizes: list[int]
    #: The first too big, if any.
    oversized: Oversized | None


def fitting(rows: Sequence[Sequence[Any]], make: Callable[[Sequence[Any]], NewMessage],
            room: int) -> Fitting:
    """The rows read by ``PUMP_READ_SQL`` up to the first whose delivery (``make``) would
    take more than ``room`` bytes, their deliveries and sizes, and that row's offset and
    size."""
    kept: list[Sequence[Any]] = []
    messages: list[NewMessage] = []
    sizes: list[int] = []
    for row in rows:
        offset = int(row[0])
        if row[2] is None:
            return Fitting(kept, messages, sizes, Oversized(offset, int(row[4] or 0), room))
        message = make(row)
        size = sent_size(message)  # (a delivery row is an enqueue's row)
        if size > room:
            return Fitting(kept, messages, sizes, Oversized(offset, size, room))
        kept.append(row)
        messages.append(message)
        sizes.append(size)
    return Fitting(kept, messages, sizes, None)


class ReadMessage(NamedTuple):
    """A sequenced message as a broadcast reader reads it."""

    offset: int
    key: str | None
    #: Its JSON; None when it is longer than one row may take under the packet (unread).
    payload: str | None
    published_at: Any
    #: Bytes of its payload.
    size: int
    #: Bytes one row may take under the server's packet: a longer payload is not read.
    room: int


def read_after(topic: str, offset: int, limit: int, max_bytes: int | None = None,
               alias: str | None = None) -> list[ReadMessage]:
    """Up to ``limit`` sequenced messages of ``topic`` after ``offset``, in offset
    order, and only as many as have ``max_bytes`` of payloads (always one at least, so a
    big message still moves; None: no bound); a payload past one row's room is left
    unread (``payload`` None) and counts nothing."""
    alias = alias or default_alias()
    room = row_room(alias)
    with connection_for(alias).cursor() as cursor:
        cursor.execute(READ_SIZES_SQL, [topic, offset, limit])
        sizes = [(int(row[0]), int(row[1] or 0)) for row in cursor.fetchall()]
        count = len(sizes) if max_bytes is None else _fitting_count(
            [size if size <= room else 0 for _, size in sizes], max_bytes)
        if not count:
            return []
        cursor.execute(READ_UP_TO_SQL, [room, topic, offset, sizes[count - 1][0], count])
        return [ReadMessage(int(row[0]), row[1], None if row[2] is None else str(row[2]),
                            row[3], int(row[4] or 0), room) for row in cursor.fetchall()]


def _fitting_count(sizes: Sequence[int], max_bytes: int) -> int:
    """How many of ``sizes``, from the first, add up to at most ``max_bytes``; at least
    one (when there is one), so a message bigger than the budget is read alone."""
    total = 0
    for count, size in enumerate(sizes):
        total += size
        if count and total > max_bytes:
            return count
    return len(sizes)
