"""Housekeeping that gives way: bounded lock waits for the worker's upkeep steps.

A stranger's ``LOCK TABLES mysqlq_rate WRITE``, a long ``ALTER TABLE`` or any other
metadata lock makes a statement on that table wait ``lock_wait_timeout`` seconds (a day
on MariaDB, a year on MySQL); a row lock held in an open transaction, up to
``innodb_lock_wait_timeout``. The recovery leader's housekeeping (retention, repairs,
promotion, schedules) runs on the control connection: while it waits, that worker claims
nothing, renews nothing and recovers nobody's messages. So these steps run under
:func:`bounded_lock_waits`, which lowers both timeouts for the session to
``MYSQLQ['UPKEEP_LOCK_WAIT_SECONDS']``, makes a lock-wait timeout final (not retried by
``with_lock_retry``) and puts the session's own values back afterwards, whatever happened:
the connection is reused by the claims, and a short wait left behind would change them.

The throttled claim and the parks' reads of the rate keys use :func:`bounded_statement`
instead: on MariaDB the bound is scoped to one statement (``SET STATEMENT … FOR``), which
costs no round trip on the claim path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from .base import connection_for, default_alias, lock_waits_final
from .locked import LOCK_WAIT_SECONDS, SESSION_WAIT_ATTRIBUTE

#: The session's own lock waits, read before they are lowered.
LOCK_WAITS_SQL = "SELECT @@session.lock_wait_timeout, @@session.innodb_lock_wait_timeout"
#: Sets both (lowering them for a step, and putting the session's values back after).
SET_LOCK_WAITS_SQL = "SET SESSION lock_wait_timeout = %s, innodb_lock_wait_timeout = %s"
#: MariaDB: a metadata-lock wait bounded for one statement only.
STATEMENT_LOCK_WAIT = "SET STATEMENT lock_wait_timeout = {seconds} FOR "


@contextlib.contextmanager
def bounded_lock_waits(seconds: int, alias: str | None = None) -> Iterator[None]:
    """Within the block, this thread's statements wait at most ``seconds`` for a table or
    row lock (never longer than the session already would), and a lock-wait timeout is
    raised at once (``is_lock_wait``); after it the session's own values are back."""
    connection = connection_for(alias or default_alias())
    with connection.cursor() as cursor:
        cursor.execute(LOCK_WAITS_SQL)
        metadata, rows = (int(value) for value in cursor.fetchone())
        cursor.execute(SET_LOCK_WAITS_SQL, [min(metadata, seconds), min(rows, seconds)])
    raw = connection.connection
    final = lock_waits_final(True)
    try:
        yield
    finally:
        lock_waits_final(final)
        _restore(connection, raw, metadata, rows)


def _restore(connection: BaseDatabaseWrapper, raw: object, metadata: int, rows: int) -> None:
    """Put the session's lock waits back on the connection the block lowered them on.

    A connection replaced meanwhile (an outage) started with the server's values. One the
    restore can't reach is closed: no lowered wait survives on a reused connection. The
    short row-lock wait a broker-owned session keeps for good (``locked.short_wait``), if
    it was first set inside the block, counts as the session's own value from then on.
    """
    if connection.connection is not raw:
        return
    if getattr(raw, SESSION_WAIT_ATTRIBUTE, False):
        rows = min(rows, LOCK_WAIT_SECONDS)
    try:
        with connection.cursor() as cursor:
            cursor.execute(SET_LOCK_WAITS_SQL, [metadata, rows])
    except DatabaseError:
        connection.close()


def bounded_statement(connection: BaseDatabaseWrapper, sql: str, seconds: int | None) -> str:
    """``sql`` made to wait at most ``seconds`` for a table's metadata lock (MariaDB; on
    MySQL, and with ``seconds`` None, as it is)."""
    if seconds is None or not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        return sql
    return STATEMENT_LOCK_WAIT.format(seconds=int(seconds)) + sql
