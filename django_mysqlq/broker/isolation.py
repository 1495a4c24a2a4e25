"""The isolation level the broker's statements need: READ COMMITTED, whatever the site uses.

Under REPEATABLE READ the claim's ``UPDATE … LIMIT`` takes next-key (gap) locks on the
claim index: claimers deadlock with each other and a producer's ``INSERT`` waits on a
claim's gap lock (measured: 4 claimers and a producer, 1,374 deadlocks in 10 s; none
under READ COMMITTED). So connections the broker owns (a worker's control and acker
threads) are switched at the session level whenever they connect, and the broker's own
short transactions on connections it doesn't own (a task thread's, whose session belongs
to the user's tasks) set the level for that one transaction only.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from ..conf import get_settings

READ_COMMITTED = "read committed"
SESSION_READ_COMMITTED_SQL = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
#: Applies to the next transaction only, then the session's own level is back.
NEXT_TRANSACTION_READ_COMMITTED_SQL = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

_OWNED_ATTRIBUTE = "_django_mysqlq_read_committed"
_owned = threading.local()


def own_connection(alias: str | None = None) -> None:
    """Make this thread's connection to the queue database the broker's own.

    It runs at READ COMMITTED from now on, reconnects included. Only for threads that
    run no user code: a task's session is the user's.
    """
    alias = alias or get_settings().DATABASE
    aliases: set[str] = getattr(_owned, "aliases", set())
    aliases.add(alias)
    _owned.aliases = aliases
    connection = connections[alias]
    if connection.connection is not None:
        try:
            _read_committed(connection)
        except DatabaseError:
            connection.close()  # gone meanwhile: the reconnect sets the level


@receiver(connection_created, dispatch_uid="django_mysqlq.broker.isolation")
def _on_connect(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    if connection.alias in getattr(_owned, "aliases", ()):
        _read_committed(connection)


def _read_committed(connection: BaseDatabaseWrapper) -> None:
    with connection.cursor() as cursor:
        cursor.execute(SESSION_READ_COMMITTED_SQL)
    setattr(connection.connection, _OWNED_ATTRIBUTE, True)


def owned(connection: BaseDatabaseWrapper) -> bool:
    """Whether this connection is one the broker owns (its session is the broker's)."""
    return bool(getattr(connection.connection, _OWNED_ATTRIBUTE, False))


def transaction_prelude(connection: BaseDatabaseWrapper) -> str | None:
    """The statement to send before a broker transaction, or None if none is needed.

    None on a connection the broker owns, or where Django set READ COMMITTED for the
    session (``OPTIONS['isolation_level']``, Django's default). Elsewhere, a transaction
    scoped ``SET TRANSACTION``: the session's own level stays the user's.
    """
    if owned(connection):
        return None
    if getattr(connection, "isolation_level", None) == READ_COMMITTED:
        return None
    return NEXT_TRANSACTION_READ_COMMITTED_SQL
