"""Statement sizes: the server's ``max_allowed_packet``, and multi-row statements cut to fit.

A statement past the packet limit is refused (error 1153) or, when it is far past it,
the server drops the connection (2006/2013): neither can be retried into success, so
every multi-row statement whose rows can be large (enqueue, history) is split by the
bytes the driver will send, escaping included, before it goes out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..exceptions import PayloadTooLarge
from .base import connection_for

T = TypeVar("T")

MAX_PACKET_SQL = "SELECT @@max_allowed_packet"
#: The limit read for a driver connection is cached on it under this name (a reconnect,
#: a new object, reads it again: the session value is fixed when a connection opens).
MAX_PACKET_ATTRIBUTE = "_django_mysqlq_max_packet"

#: Most bytes in one multi-row statement even when the packet allows more: past a few
#: MiB, bigger statements save nothing and hold the server's memory longer.
STATEMENT_BYTES = 4 * 2**20
#: Room kept free in a packet for the statement's own text and the protocol's framing.
PACKET_HEADROOM = 64 * 2**10
#: Bytes a non-string parameter can take in a statement (a number, a date, NULL).
SCALAR_BYTES = 32
#: Strings shorter than this are sized by a bound (4 bytes a character) rather than
#: measured: cheap for the many small values, exact for the few big ones.
MEASURE_FROM = 4096
#: What the driver escapes with a backslash, each one byte more on the wire.
_ESCAPED = ("\\", "'", '"', "\0", "\n", "\r", "\x1a")


def max_packet(alias: str | None = None) -> int:
    """``@@max_allowed_packet`` of this thread's connection, read once per connection."""
    connection = connection_for(alias)
    connection.ensure_connection()
    raw = connection.connection
    cached: int | None = getattr(raw, MAX_PACKET_ATTRIBUTE, None)
    if cached is None:
        with connection.cursor() as cursor:
            cursor.execute(MAX_PACKET_SQL)
            cached = int(cursor.fetchone()[0])
        setattr(raw, MAX_PACKET_ATTRIBUTE, cached)
    return cached


def row_room(alias: str | None = None) -> int:
    """The most bytes one row may take: a statement of that row alone still fits."""
    packet = max_packet(alias)
    return max(packet // 2, packet - PACKET_HEADROOM)


def refuse_past_packet(sizes: Sequence[int], alias: str, subject: Callable[[int], str], *,
                       room_for: str, send: str, reserved: int = 0) -> None:
    """Raise ``PayloadTooLarge`` before anything is written when the largest of ``sizes``
    passes one row's room less ``reserved`` (bytes its later statements add): the server
    would refuse that statement each time, so it can never succeed.

    The error reads ``subject(index)`` ("The arguments of task 'x' take"), then the sizes,
    what the room is for (``room_for``) and how else to ``send`` the data (its key).
    """
    if not sizes:
        return
    index = max(range(len(sizes)), key=sizes.__getitem__)
    room = row_room(alias) - reserved
    if sizes[index] > room:
        raise PayloadTooLarge(
            f"{subject(index)} {sizes[index]} bytes in a statement, and the server's "
            f"max_allowed_packet ({max_packet(alias)} bytes) leaves {room} for {room_for}: "
            f"store large data in a table or file and {send} its key, or raise "
            "max_allowed_packet on the server (and keep MYSQLQ['MAX_PAYLOAD_BYTES'] "
            "under it).")


def statement_room(alias: str | None = None) -> int:
    """The bytes a multi-row statement is filled up to."""
    return min(STATEMENT_BYTES, row_room(alias))


def escaped_size(value: Any) -> int:
    """Bytes ``value`` takes in a statement as the driver writes it (never less)."""
    if isinstance(value, str):
        if len(value) < MEASURE_FROM:
            return 4 * len(value) + 2
        encoded = len(value) if value.isascii() else len(value.encode("utf-8", "replace"))
        return encoded + sum(value.count(char) for char in _ESCAPED) + 2
    if isinstance(value, bytes | bytearray):
        return 2 * len(value) + 10
    return SCALAR_BYTES


def params_size(params: Sequence[Any]) -> int:
    """``escaped_size`` summed over a statement's parameters (inlined: it runs per row)."""
    total = 0
    for value in params:
        if isinstance(value, str):
            length = len(value)
            total += 4 * length + 2 if length < MEASURE_FROM else escaped_size(value)
        elif isinstance(value, bytes | bytearray):
            total += 2 * len(value) + 10
        else:
            total += SCALAR_BYTES
    return total


def split_by_size(items: Sequence[T], sizes: Sequence[int], room: int,
                  max_rows: int) -> list[Sequence[T]]:
    """Consecutive parts of ``items`` of at most ``max_rows`` items and ``room`` bytes.

    An item bigger than ``room`` on its own gets a part to itself: whether it fits a
    packet at all is the caller's business (see ``row_room``).
    """
    parts: list[Sequence[T]] = []
    start = size = 0
    for index, length in enumerate(sizes):
        if index > start and (index - start >= max_rows or size + length > room):
            parts.append(items[start:index])
            start, size = index, 0
        size += length
    if start < len(items):
        parts.append(items[start:])
    return parts
