"""Producers of one dedup key insert it one at a time: a named lock around the INSERT.

A finished message's row stays in the unique index of ``dedup_key`` as a deleted entry
until InnoDB purges it: seconds after the ack, much longer under purge lag. Two
transactions inserting that key at that moment each take a shared next-key lock on the
deleted entry for their duplicate check, then each waits for the other's to insert: a
deadlock (1213), and the server rolls back the whole transaction of one caller (measured:
8 to 12 of 60 pairs of producers, with and without a long transaction holding purge).

Under the named lock the second INSERT starts once the first has written its row: it
finds that row and waits for its commit like any unique key (then sees the duplicate, and
``enqueue`` returns the holder). The lock is held for the statement only, not to the
commit. A producer that can't have it within :data:`LOCK_WAIT_SECONDS` inserts without it
(as before): the lock never adds a wait of its own longer than that, even in a cycle
InnoDB's deadlock detector can't see (a transaction that holds the key's row and enqueues
the key again while another producer waits for that row under the lock).

Not on a Galera cluster (a named lock is one node's; certification decides there) nor
behind a proxy (its release must reach the same server session).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

from django.db import DatabaseError

from .base import connection_for
from .session import connection_session

#: Longest wait for another producer of the key to finish its INSERT.
LOCK_WAIT_SECONDS = 2
GET_LOCK_SQL = "SELECT GET_LOCK(%s, %s)"
RELEASE_LOCK_SQL = "DO RELEASE_LOCK(%s)"


def lock_name(key: str) -> str:
    """The key's lock: a digest (names are at most 64 characters; keys up to 255)."""
    return "mysqlq:dedup:" + hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()


@contextlib.contextmanager
def one_inserter(alias: str, key: str) -> Iterator[bool]:
    """Hold the key's lock around the block (yields whether it was taken)."""
    session = connection_session(alias)
    if session.cluster or not session.direct:
        yield False
        return
    name = lock_name(key)
    with connection_for(alias).cursor() as cursor:
        cursor.execute(GET_LOCK_SQL, [name, LOCK_WAIT_SECONDS])
        taken = cursor.fetchone()[0] == 1
    try:
        yield taken
    finally:
        if taken:
            with contextlib.suppress(DatabaseError):  # a lost connection lost the lock too
                with connection_for(alias).cursor() as cursor:
                    cursor.execute(RELEASE_LOCK_SQL, [name])
