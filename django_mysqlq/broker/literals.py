"""Batch statements with their parameters escaped in, each distinct value once.

The driver escapes every parameter of a statement on its own (``MySQLdb``'s
``literal``, a few Python calls each). A batch's rows repeat most of theirs: the queue,
the task, the worker, the host, the claim token, the attempt, the outcome. In a worker
draining no-op work that escaping was a fifth to a quarter of the process's CPU (a
py-spy profile of a consumer group's member: docs/performance.md). Here each distinct
value is escaped once per statement, by the driver's own ``literal``, so the text sent is
byte for byte what the driver would have sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def escaped(cursor: Any, sql: str, params: Sequence[Any]) -> str | None:
    """``sql`` with ``params`` in, as the driver would bind them; None when a value
    can't go through text (raw bytes that are not UTF-8: let the driver send those)."""
    raw = getattr(getattr(cursor, "db", None), "connection", None)
    literal = getattr(raw, "literal", None)
    if literal is None:
        return None
    # A str is its own key; other values are keyed with their type (1, 1.0 and True
    # are equal as keys but escape as 1, 1.0e0 and 1).
    memo: dict[Any, str] = {}
    texts: list[str] = []
    append = texts.append
    try:
        for value in params:
            try:
                key = value if value.__class__ is str else (value.__class__, value)
                text = memo.get(key)
            except TypeError:  # unhashable (a list): no memo
                append(literal(value).decode())
                continue
            if text is None:
                text = memo[key] = literal(value).decode()
            append(text)
    except UnicodeDecodeError:
        return None
    return sql % tuple(texts)


def execute_escaped(cursor: Any, sql: str, params: Sequence[Any]) -> None:
    """``cursor.execute(sql, params)``, each distinct value escaped once."""
    statement = escaped(cursor, sql, params)
    if statement is None:
        cursor.execute(sql, params)
    else:
        cursor.execute(statement)
