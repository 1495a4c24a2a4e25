"""Rows locked by others: the claim and the promotion don't wait for them, they step around.

A ready or due row locked by another transaction stops an ``UPDATE … ORDER BY … LIMIT``
that walks onto it: InnoDB's semi-consistent read, which lets an update pass rows others
have locked under READ COMMITTED, applies to scans of the clustered index only, and these
statements scan a secondary one (``FORCE INDEX``). Most often the row is a producer's:
``with transaction.atomic(): task.enqueue(…); <more work>`` keeps the new row locked,
uncommitted, until that transaction commits (a delayed message's too, once it is due).
Now and then it is a stranger's: a ``SELECT … FOR UPDATE`` left open, a long operator
transaction. Waited on, it would hold the worker's control thread, which claims for all
its queues, for the lock wait (``innodb_lock_wait_timeout``: 50 s by default).

So on MariaDB the fast statements wait for no row lock (``SET STATEMENT
innodb_lock_wait_timeout = 0``, that statement only): a locked row is tried again after a
few milliseconds (``BRIEF_LOCK_PAUSES``: another worker's claim holds its rows for the
milliseconds of its statement), then that call takes its rows with ``SELECT … FOR UPDATE
SKIP LOCKED`` and an ``UPDATE`` by id, which steps over the locked row, and so do the
calls for that queue (or duty) for a while; the one-statement fast path is tried again
after a pause: ``AROUND_LOOK_AGAIN_SECONDS`` first, in silence (most such locks are gone
by then: a producer's short transaction), then 5 s, growing while a locked row is still
met. MySQL's smallest lock wait is 1 s: there the fast statements wait that long (the
session's wait), once per pause, and a lock that outlasted it starts the episode at once.

A lock still there when the fast path looks again is said at INFO and counted in
``lock_waits``; a WARNING follows once the pause has grown to ``AROUND_WARNING_SECONDS``,
the fast path having met a locked row at every try for about 15 s: a transaction that
holds queue rows that long is one to find. The claim first asks whether a committed ready
row is held (``held``: a plain read, then the same rows ``SKIP LOCKED``, twice): rows a
producer inserted and has not committed are invisible to everyone until it commits and
cost nobody anything, so a site whose producers keep short transactions open one after
another (the stream met at every look) is stepped around in silence, uncounted.

A table's metadata lock (``LOCK TABLES``, an ``ALTER TABLE``) gives the same error, 1205,
after ``lock_wait_timeout``: on MariaDB one that came after a wait can't be a row's (the
statement waits for none), and is raised at once (``TableLockWait``), not retried nor
stepped around.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from .base import (
    DEADLOCK,
    connection_for,
    error_code,
    logger,
    past_deadline,
    stats,
    with_lock_retry,
)
from .isolation import owned

#: The short row-lock wait (InnoDB counts whole seconds): the fast statements' on MySQL,
#: whose minimum it is; a schedule's advance; a connection the broker owns keeps it as its
#: session's wait for its other statements.
LOCK_WAIT_SECONDS = 1
#: The fast statements' row-lock wait on MariaDB: none.
FAST_LOCK_WAIT_SECONDS = 0
LOCK_WAIT_TIMEOUT = 1205
#: MariaDB: pauses (jittered) before the fast statement is tried again after it met a
#: locked row, before the call steps around it: a row another claim holds is free again
#: in milliseconds (six claimers on one queue: half their statements met one at once,
#: under 2% after these).
BRIEF_LOCK_PAUSES = (0.005, 0.02, 0.05)
#: MariaDB: the fast statements wait for no row lock, so a lock wait timeout that came only
#: after this long was a wait for the table's metadata lock (another session's ``LOCK
#: TABLES``, an ``ALTER TABLE`` running or waiting for its turn: ``lock_wait_timeout``,
#: whole seconds). It is neither retried nor stepped around (``SKIP LOCKED`` skips rows,
#: not a table): the caller gets it at once (``TableLockWait``).
TABLE_LOCK_SECONDS = 0.5
#: MariaDB: the pause after a first locked row met without a wait, before the fast path
#: looks again (nothing said, nothing counted if it is gone by then).
AROUND_LOOK_AGAIN_SECONDS = 0.5
#: First and longest pause before the fast path is tried again after a locked row.
AROUND_FIRST_SECONDS = 5.0
AROUND_LONGEST_SECONDS = 60.0
#: A locked row still met when the pause grows to this (5 s, 10 s, then 20 s: about 15 s
#: after the episode began) is warned of, once per episode.
AROUND_WARNING_SECONDS = 20.0

#: MariaDB scopes a variable to one statement; MySQL can't for InnoDB's variables, so its
#: session gets the short wait instead, as does any connection the broker owns.
_STATEMENT_WAIT = f"SET STATEMENT innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS} FOR "
_STATEMENT_NO_WAIT = f"SET STATEMENT innodb_lock_wait_timeout = {FAST_LOCK_WAIT_SECONDS} FOR "
SESSION_WAIT_SQL = f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS}"
SESSION_WAIT_ATTRIBUTE = "_django_mysqlq_short_lock_wait"

#: What ``LockedRows.found`` says of a meeting: a first look (no episode yet), the
#: episode's first, or the one that makes it a lasting lock (warned of).
LOOK = "look"
FIRST = "first"
LASTING = "lasting"


class TableLockWait(OperationalError):
    """A fast statement's lock wait timeout (1205, as ``is_lock_wait`` says) that was a
    wait for the table's metadata lock, not for a row: see ``TABLE_LOCK_SECONDS``."""


class LockedRows:
    """Per (database, queue or duty): whether to step around locked rows, and until when."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[tuple[str, str], float] = {}
        self._pause: dict[tuple[str, str], float] = {}
        self._since: dict[tuple[str, str], float] = {}

    def around(self, key: tuple[str, str]) -> bool:
        with self._lock:
            return time.monotonic() < self._until.get(key, 0.0)

    def found(self, key: tuple[str, str], waited: bool) -> tuple[str, float, float]:
        """The fast path met a locked row (``waited``: after a lock wait; else at once):
        step around for a while. Returns what the meeting is, the pause before the next
        try and the seconds since the first meeting. A first row met without a wait starts
        no episode yet (``LOOK``): it is looked at again after
        ``AROUND_LOOK_AGAIN_SECONDS``; met again then (or after a wait), the episode's
        ``FIRST``; ``LASTING`` when the pause grows to ``AROUND_WARNING_SECONDS``; else
        ""."""
        with self._lock:
            now = time.monotonic()
            pause = self._pause.get(key)
            if pause is not None and now - self._until.get(key, now) > AROUND_LONGEST_SECONDS:
                # An episode the fast path never came back to (the queue paused, no room to
                # claim, earlier queues filling each batch): this is a new one.
                self._pause.pop(key, None)
                self._since.pop(key, None)
                pause = None
            if _first_look(pause, self._since.get(key), now, waited):
                self._since[key] = now  # (a look long ago, never followed: a new one)
                self._until[key] = now + AROUND_LOOK_AGAIN_SECONDS
                return LOOK, AROUND_LOOK_AGAIN_SECONDS, 0.0
            self._pause[key] = min((pause or AROUND_FIRST_SECONDS / 2) * 2,
                                   AROUND_LONGEST_SECONDS)
            self._until[key] = now + self._pause[key]
            since = self._since.setdefault(key, now)
            if pause is None:
                kind = FIRST
            elif pause < AROUND_WARNING_SECONDS <= self._pause[key]:
                kind = LASTING
            else:
                kind = ""
            return kind, self._pause[key], now - since

    def looks_first(self, key: tuple[str, str], waited: bool) -> bool:
        """Whether a meeting now would be a first look (``found`` would say ``LOOK``):
        nothing to judge yet."""
        with self._lock:
            now = time.monotonic()
            pause = self._pause.get(key)
            if pause is not None and now - self._until.get(key, now) > AROUND_LONGEST_SECONDS:
                pause = None
            return _first_look(pause, self._since.get(key), now, waited)

    def uncommitted(self, key: tuple[str, str]) -> None:
        """The rows in the way were inserted by a transaction not yet committed (no
        committed row is held): step around them for ``AROUND_FIRST_SECONDS``, in silence;
        an episode of held rows, if one is on, is left as it is."""
        with self._lock:
            now = time.monotonic()
            self._until[key] = max(self._until.get(key, now), now + AROUND_FIRST_SECONDS)

    def cleared(self, key: tuple[str, str]) -> None:
        """The fast path went through: the lock is gone."""
        if not self._since:
            return  # the common case, read without the lock: nothing was locked anywhere
        with self._lock:
            self._since.pop(key, None)
            self._until.pop(key, None)
            if self._pause.pop(key, None) is not None:
                logger.info("%s: no locked row in the way any more; back to the fast path.",
                            key[1])

    def forget(self) -> None:
        with self._lock:
            self._until.clear()
            self._pause.clear()
            self._since.clear()


def _first_look(pause: float | None, looked: float | None, now: float, waited: bool) -> bool:
    """No episode on, no wait, and no look lately (or one long ago, never followed)."""
    return pause is None and not waited and (
        looked is None or now - looked > 10 * AROUND_LOOK_AGAIN_SECONDS)


LOCKED_ROWS = LockedRows()


def _keep_session_wait(connection: BaseDatabaseWrapper) -> None:
    """Give the session the short row-lock wait, once per connection."""
    raw = connection.connection
    if not getattr(raw, SESSION_WAIT_ATTRIBUTE, False):
        with connection.cursor() as cursor:
            cursor.execute(SESSION_WAIT_SQL)
        setattr(raw, SESSION_WAIT_ATTRIBUTE, True)


def short_wait(connection: BaseDatabaseWrapper, sql: str) -> str:
    """``sql`` made to wait at most ``LOCK_WAIT_SECONDS`` for a row lock.

    On a connection the broker owns (a worker's control connection) the session gets the
    short wait once; elsewhere MariaDB scopes it to the statement.
    """
    if connection.mysql_is_mariadb and not owned(connection):  # type: ignore[attr-defined]
        return _STATEMENT_WAIT + sql
    _keep_session_wait(connection)
    return sql


def no_wait(connection: BaseDatabaseWrapper, sql: str) -> str:
    """A fast statement (the claim's, the promotion's) that waits for no row lock.

    MariaDB: scoped to the statement, on a connection the broker owns too, whose session
    keeps the short wait (``short_wait``) for its other statements: only these two have a
    way around a locked row. MySQL's smallest wait is 1 s: ``short_wait`` there.
    """
    if not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        return short_wait(connection, sql)
    if owned(connection):
        _keep_session_wait(connection)
    return _STATEMENT_NO_WAIT + sql


def _fast(alias: str, fast: Callable[[], int]) -> int:
    """``fast()``, retried on deadlocks; on MariaDB also after ``BRIEF_LOCK_PAUSES``
    when it met a locked row (it waited for none), but not after a wait for the table's
    metadata lock: that raises ``TableLockWait`` at once."""
    pauses: tuple[float, ...] | None = None
    began = [0.0]

    def timed() -> int:
        began[0] = time.monotonic()
        return fast()

    while True:
        try:
            return with_lock_retry(alias, timed, codes=frozenset({DEADLOCK}))
        except OperationalError as exc:
            if error_code(exc) != LOCK_WAIT_TIMEOUT or past_deadline():
                raise
            waited = time.monotonic() - began[0]
            mariadb = connection_for(alias).mysql_is_mariadb  # type: ignore[attr-defined]
            if mariadb and waited >= TABLE_LOCK_SECONDS:
                raise TableLockWait(
                    LOCK_WAIT_TIMEOUT, f"Lock wait timeout exceeded after {waited:.0f} s "
                    "waiting for the table's metadata lock (another session's LOCK TABLES, "
                    "or an ALTER TABLE), not for a row's lock") from exc
            if pauses is None:
                pauses = BRIEF_LOCK_PAUSES if mariadb else ()
            if not pauses:
                raise
            time.sleep(random.uniform(0.5, 1.5) * pauses[0])
            pauses = pauses[1:]


def run_around_locks(alias: str, key: tuple[str, str], what: str,
                     fast: Callable[[], int], around: Callable[[], int],
                     held: Callable[[], bool] | None = None) -> int:
    """``fast()``, or ``around()`` (SKIP LOCKED) while a locked row is in ``key``'s way.

    ``fast`` is retried here on deadlocks (and briefly on a locked row, see ``_fast``);
    ``around`` runs its own transaction (and its retries: ``in_transaction``). A wait for
    the table's metadata lock (``TableLockWait``) is raised as it is: no row is in the
    way, and ``around`` would wait for the table too. ``held``: whether a committed row
    in the way is held by another transaction, asked before a meeting is judged (counted,
    said); when it says no, the rows were a producer's not yet committed: stepped around
    in silence (``LockedRows.uncommitted``).
    """
    if LOCKED_ROWS.around(key):
        return around()
    try:
        count = _fast(alias, fast)
    except OperationalError as exc:
        if error_code(exc) != LOCK_WAIT_TIMEOUT or isinstance(exc, TableLockWait):
            raise
        waited = not connection_for(alias).mysql_is_mariadb  # type: ignore[attr-defined]
        if held is not None and not LOCKED_ROWS.looks_first(key, waited) and not held():
            LOCKED_ROWS.uncommitted(key)
            return around()
        kind, pause, lasted = LOCKED_ROWS.found(key, waited)
        if kind != LOOK:
            stats.count(LOCK_WAIT_TIMEOUT)
        if kind == FIRST:
            logger.info(
                "%s: a row is locked by another transaction, %s; stepping around it "
                "with SELECT … FOR UPDATE SKIP LOCKED, and trying the fast path again in "
                "%d s. A warning follows if it lasts.", what,
                "a ready message (a SELECT … FOR UPDATE, or an update not yet committed)"
                if held is not None else "most likely a producer's that enqueued it and has "
                "not committed yet (it commits soon)", pause)
        elif kind == LASTING:
            logger.warning(
                "%s: the fast path has met a locked row at every try for %d s (one long "
                "transaction, or a steady stream of transactions that enqueue and stay open "
                "a while). The rest keeps flowing around them; a locked message waits for "
                "its lock. Find the transactions that hold queue rows "
                "(information_schema.INNODB_TRX, its trx_started: a SELECT … FOR UPDATE "
                "left open, a long operator transaction, a producer's transaction that "
                "enqueued and then ran on) and end or shorten them.", what, lasted)
        return around()
    LOCKED_ROWS.cleared(key)
    return count
