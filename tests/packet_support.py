"""Helpers for the tests of what fits the server's ``max_allowed_packet`` and how deep a
payload may nest (enqueue, publish, acks, tampered topic rows)."""

from __future__ import annotations

from typing import Any

from django.db import connection


def nested(depth: int, inner: Any = None) -> Any:
    """``inner`` within ``depth`` lists (depth 0: ``inner`` itself)."""
    value = inner
    for _ in range(depth):
        value = [value]
    return value


def server_packet() -> int:
    """The session's ``@@max_allowed_packet`` on the default connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        return int(cursor.fetchone()[0])
