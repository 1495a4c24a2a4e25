"""Rows locked by strangers: the claim and the promotion wait briefly, then step around them.

A ready or due row locked by another transaction (a ``SELECT … FOR UPDATE`` left open, a
long operator transaction) stops an ``UPDATE … ORDER BY … LIMIT`` that walks onto it for
InnoDB's ``innodb_lock_wait_timeout`` (50 s by default), again on every try, and nothing
behind it moves. So these statements wait at most ``LOCK_WAIT_SECONDS``; past that, the
same rows are taken for a while with ``SELECT … FOR UPDATE SKIP LOCKED`` and an ``UPDATE``
by id, which steps over the locked row, and the one-statement fast path is tried again
after a growing pause (one short wait per pause while the lock lasts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from .base import DEADLOCK, error_code, logger, stats, with_lock_retry
from .isolation import owned

#: Longest the fast statements wait for a row lock (InnoDB counts whole seconds).
LOCK_WAIT_SECONDS = 1
LOCK_WAIT_TIMEOUT = 1205
#: First and longest pause before the fast path is tried again after a locked row.
AROUND_FIRST_SECONDS = 5.0
AROUND_LONGEST_SECONDS = 60.0

#: MariaDB scopes a variable to one statement; MySQL can't for InnoDB's variables, so its
#: session gets the short wait instead, as does any connection the broker owns.
_STATEMENT_WAIT = f"SET STATEMENT innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS} FOR "
SESSION_WAIT_SQL = f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS}"
SESSION_WAIT_ATTRIBUTE = "_django_mysqlq_short_lock_wait"


class LockedRows:
    """Per (database, queue or duty): whether to step around locked rows, and until when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[tuple[str, str], float] = {}
        self._pause: dict[tuple[str, str], float] = {}

    def around(self, key: tuple[str, str]) -> bool:
        with self._lock:
            return time.monotonic() < self._until.get(key, 0.0)

    def found(self, key: tuple[str, str]) -> bool:
        """A lock wait timed out: step around for a while. True when it is news."""
        with self._lock:
            pause = self._pause.get(key)
            self._pause[key] = min((pause or AROUND_FIRST_SECONDS / 2) * 2,
                                   AROUND_LONGEST_SECONDS)
            self._until[key] = time.monotonic() + self._pause[key]
            return pause is None

    def cleared(self, key: tuple[str, str]) -> None:
        """The fast path went through: the lock is gone."""
        if not self._pause:
            return  # the common case, read without the lock: nothing was locked anywhere
        with self._lock:
            if self._pause.pop(key, None) is not None:
                self._until.pop(key, None)
                logger.info("%s: no locked row in the way any more; back to the fast path.",
                            key[1])

    def forget(self) -> None:
        with self._lock:
            self._until.clear()
            self._pause.clear()


LOCKED_ROWS = LockedRows()


def short_wait(connection: BaseDatabaseWrapper, sql: str) -> str:
    """``sql`` made to wait at most ``LOCK_WAIT_SECONDS`` for a row lock.

    On a connection the broker owns (a worker's control connection) the session gets the
    short wait once; elsewhere MariaDB scopes it to the statement.
    """
    if connection.mysql_is_mariadb and not owned(connection):  # type: ignore[attr-defined]
        return _STATEMENT_WAIT + sql
    raw = connection.connection
    if not getattr(raw, SESSION_WAIT_ATTRIBUTE, False):
        with connection.cursor() as cursor:
            cursor.execute(SESSION_WAIT_SQL)
        setattr(raw, SESSION_WAIT_ATTRIBUTE, True)
    return sql


def run_around_locks(alias: str, key: tuple[str, str], what: str,
                     fast: Callable[[], int], around: Callable[[], int]) -> int:
    """``fast()``, or ``around()`` (SKIP LOCKED) while a locked row is in ``key``'s way.

    ``fast`` is retried here on deadlocks; ``around`` runs its own transaction (and its
    retries: ``in_transaction``).
    """
    if LOCKED_ROWS.around(key):
        return around()
    try:
        count = with_lock_retry(alias, fast, codes=frozenset({DEADLOCK}))
    except OperationalError as exc:
        if error_code(exc) != LOCK_WAIT_TIMEOUT:
            raise
        stats.count(LOCK_WAIT_TIMEOUT)
        if LOCKED_ROWS.found(key):
            logger.warning(
                "%s: a row is locked by another transaction (waited %ds); stepping around it "
                "with SELECT … FOR UPDATE SKIP LOCKED, and trying the fast path again now and "
                "then. Find the transaction that holds queue rows (information_schema."
                "INNODB_TRX, a SELECT … FOR UPDATE left open, a long operator transaction) "
                "and end it.", what, LOCK_WAIT_SECONDS)
        return around()
    LOCKED_ROWS.cleared(key)
    return count
