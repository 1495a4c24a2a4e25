"""Who sweeps: the one recovery leader of a queue database.

On a single server the leader holds a named lock (``GET_LOCK``) on its connection, freed
the moment that connection goes. On a Galera cluster named locks are per node (each node
would have a leader of its own; some versions refuse ``GET_LOCK`` there altogether), so
the leader holds the ``recover`` row of ``mysqlq_lease`` instead: taken by a conditional
``UPDATE`` when it is free or has lapsed, renewed by each of the leader's sweeps, lapsing
``LEASE_SECONDS`` after the last one (a leader on a node that died is replaced then). Two
nodes taking a lapsed lease at once conflict at commit: one is retried, finds the lease
held, and follows.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import uuid
from typing import Any

from ..conf import get_settings
from .base import (
    MESSAGE_TABLE,
    RECOVERY_LOCK_NAME,
    connection_for,
    micros,
    with_lock_retry,
)
from .session import Session

LEASE_TABLE = "mysqlq_lease"
#: The lease row of the recovery sweep.
RECOVERY_LEASE = "recover"

RECOVERY_LOCK_SQL = f"SELECT GET_LOCK({RECOVERY_LOCK_NAME}, 0)"
RECOVERY_UNLOCK_SQL = f"SELECT RELEASE_LOCK({RECOVERY_LOCK_NAME})"

#: Takes the lease if it is ours already or has lapsed, and (re)sets its expiry.
TAKE_LEASE_SQL = f"""
UPDATE {LEASE_TABLE}
   SET holder = %s, expires_at = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND
 WHERE name = %s AND (holder = %s OR expires_at < UTC_TIMESTAMP(6))
"""
#: The lease row's first taker creates it (a second one's insert is ignored).
CREATE_LEASE_SQL = f"""
INSERT IGNORE INTO {LEASE_TABLE} (name, holder, expires_at)
VALUES (%s, %s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND)
"""
#: Gives the lease up at once (a one-off sweep that is done).
END_LEASE_SQL = f"""
UPDATE {LEASE_TABLE} SET expires_at = UTC_TIMESTAMP(6) WHERE name = %s AND holder = %s
"""

#: The idle park's sweep checks (see ``park.idle_wait``), each a condition and its
#: parameters. On a server: the leader sweeps when anything is claimed (an owner may be
#: gone), a follower when the lock is free (the leader is gone).
SERVER_LEADER_DUE = (f"EXISTS (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_lease) "
                     "WHERE status = 'claimed')")
SERVER_FOLLOWER_DUE = f"IS_FREE_LOCK({RECOVERY_LOCK_NAME}) = 1"
#: On a cluster: the leader when a claim's lease ran out or its own lease needs renewing,
#: a follower when the lease lapsed (or is its own: it lost count of it).
CLUSTER_LEADER_DUE = f"""(
  EXISTS (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_lease)
           WHERE status = 'claimed' AND lease_expires_at < UTC_TIMESTAMP(6))
  OR NOT EXISTS (SELECT 1 FROM {LEASE_TABLE}
                  WHERE name = %s AND holder = %s
                    AND expires_at > UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND))"""
CLUSTER_FOLLOWER_DUE = f"""NOT EXISTS (
  SELECT 1 FROM {LEASE_TABLE}
   WHERE name = %s AND holder <> %s AND expires_at >= UTC_TIMESTAMP(6))"""

_LEADER_ATTRIBUTE = "_django_mysqlq_recovery_leader"
#: Seconds before the lease's end at which this process stops counting on it (the time
#: its renewal took to come back, and a clock that runs a little fast).
LEASE_MARGIN = 0.5

_holder = threading.local()


def holder_id() -> str:
    """This thread's name on the lease: host, pid, thread, and a random part (a forked
    child or a restarted process never passes for its parent or its previous life)."""
    pid = os.getpid()
    if getattr(_holder, "pid", None) != pid:
        _holder.pid = pid
        _holder.name = (f"{socket.gethostname()[:150]}:{pid}:{threading.get_ident()}:"
                        f"{uuid.uuid4().hex[:8]}")
    return str(_holder.name)


def is_recovery_leader(alias: str | None = None) -> bool:
    """Whether this thread's connection leads the sweeps for good (see ``recover``): it
    holds the lock, or a lease that has not run out."""
    raw = connection_for(alias).connection
    held = getattr(raw, _LEADER_ATTRIBUTE, None) if raw is not None else None
    if isinstance(held, float):
        return time.monotonic() < held
    return bool(held)


@dataclasses.dataclass(frozen=True)
class Lead:
    """A sweep's right to run, and what to give back after it."""

    release: bool
    lease: bool


def take(alias: str, cursor: Any, session: Session, keep: bool) -> Lead | None:
    """Take (or, held, renew) the lead of the sweeps; None when a peer has it.

    With ``keep`` it stays with this connection (the lock) or this thread (the lease,
    renewed by each sweep) for the sweeps to come.
    """
    connection = connection_for(alias)
    if not session.cluster:
        if is_recovery_leader(alias):
            return Lead(release=False, lease=False)
        cursor.execute(RECOVERY_LOCK_SQL)
        if cursor.fetchone()[0] != 1:
            return None
        if keep:
            setattr(connection.connection, _LEADER_ATTRIBUTE, True)
        return Lead(release=not keep, lease=False)
    lease = get_settings().LEASE_SECONDS
    if not _take_lease(alias, lease):
        setattr(connection.connection, _LEADER_ATTRIBUTE, None)
        return None
    if keep:
        setattr(connection.connection, _LEADER_ATTRIBUTE,
                time.monotonic() + max(0.0, lease - LEASE_MARGIN))
    return Lead(release=not keep, lease=True)


def _take_lease(alias: str, lease: float) -> bool:
    holder = holder_id()

    def run() -> bool:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(TAKE_LEASE_SQL, [holder, micros(lease), RECOVERY_LEASE, holder])
            if cursor.rowcount:
                return True
            cursor.execute(CREATE_LEASE_SQL, [RECOVERY_LEASE, holder, micros(lease)])
            return bool(cursor.rowcount)

    # Autocommit statements: a certification conflict (another node took it at the same
    # moment) is retried, and the retry sees who won.
    return with_lock_retry(alias, run)


def end(cursor: Any, lead: Lead) -> None:
    """Give back a lead taken for one sweep only."""
    if not lead.release:
        return
    if lead.lease:
        cursor.execute(END_LEASE_SQL, [RECOVERY_LEASE, holder_id()])
    else:
        cursor.execute(RECOVERY_UNLOCK_SQL)
        cursor.fetchone()


def resign(alias: str | None = None) -> bool:
    """Give up the lead this connection keeps (``take`` with ``keep``); return whether it
    had it.

    A stopping worker does this first: its connection lives on through the drain (up to
    ``GRACE_SECONDS``), and so would its lock, while no peer could sweep. A peer now takes
    the lead at its next try. The mark goes first: a connection the statement can't reach
    is gone, and its lock with it.
    """
    connection = connection_for(alias)
    raw = connection.connection
    held = getattr(raw, _LEADER_ATTRIBUTE, None) if raw is not None else None
    if held is None:
        return False
    setattr(raw, _LEADER_ATTRIBUTE, None)
    with connection.cursor() as cursor:
        if isinstance(held, float):  # a cluster's lease (its end is harmless if it lapsed)
            cursor.execute(END_LEASE_SQL, [RECOVERY_LEASE, holder_id()])
        else:
            cursor.execute(RECOVERY_UNLOCK_SQL)
            cursor.fetchone()
    return True


def park_checks(session: Session) -> tuple[str, list[Any], str, list[Any]]:
    """The park's leader and follower conditions for this connection, with parameters."""
    if not session.cluster:
        return SERVER_LEADER_DUE, [], SERVER_FOLLOWER_DUE, []
    holder = holder_id()
    renew_within = micros(get_settings().LEASE_SECONDS / 2)
    return (CLUSTER_LEADER_DUE, [RECOVERY_LEASE, holder, renew_within],
            CLUSTER_FOLLOWER_DUE, [RECOVERY_LEASE, holder])
