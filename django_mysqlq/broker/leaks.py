"""Transactions a task left open behind Django's back, as the server sees them.

Django's own state (``in_atomic_block``, ``autocommit``) can't see a ``START TRANSACTION``
or ``SET autocommit = 0`` sent through a raw cursor; the worker asks the server after
each task (see ``worker/executor.py``).
"""

from __future__ import annotations

from django.db import OperationalError

from .base import connection_for, error_code

#: Whether the session has a transaction open, and whether autocommit is on (MariaDB).
SESSION_TRANSACTION_SQL = "SELECT @@in_transaction, @@autocommit"
AUTOCOMMIT_SQL = "SELECT @@autocommit"
#: Refused with error 1568 while a transaction is open, on MySQL and MariaDB alike; outside
#: one it only sets the next transaction's access mode to the default.
NEXT_TRANSACTION_SQL = "SET TRANSACTION READ WRITE"
TRANSACTION_IN_PROGRESS = 1568


def transaction_left_open(alias: str, via: str | None = None) -> bool:
    """Whether this thread's connection has a transaction open on the server, or autocommit
    off, whatever Django believes: a task may have sent ``START TRANSACTION`` or
    ``SET autocommit = 0`` through a raw cursor.

    ``via`` forces the ``mariadb`` (``@@in_transaction``) or ``mysql`` (error 1568 on
    ``SET TRANSACTION``) way of asking; by default the server's own.
    """
    connection = connection_for(alias)
    if via is None:
        via = "mariadb" if connection.mysql_is_mariadb else "mysql"  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        if via == "mariadb":
            cursor.execute(SESSION_TRANSACTION_SQL)
            in_transaction, autocommit = cursor.fetchone()
            return bool(in_transaction) or not autocommit
        cursor.execute(AUTOCOMMIT_SQL)
        if not cursor.fetchone()[0]:
            return True
        try:
            cursor.execute(NEXT_TRANSACTION_SQL)
        except OperationalError as exc:
            if error_code(exc) == TRANSACTION_IN_PROGRESS:
                return True
            raise
    return False
