"""Idle workers park in one ``SELECT … SLEEP()``; producers wake them with ``KILL QUERY``.

On a Galera cluster a connection id means something on its own node only, so a parked
worker also holds the lock of its own ``mysqlq_worker`` row while it sleeps. A producer on
another node wakes it by clearing that row's ``listening`` flag: when the change reaches
the worker's node, the cluster aborts the transaction that holds the lock (a brute-force
abort), which ends the SLEEP at once. A producer on the same node sends ``KILL QUERY``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, OperationalError

from ..conf import get_settings
from ..models import CLAIM_INDEX, MessageStatus
from . import leader
from .base import (
    DEADLOCK,
    MESSAGE_TABLE,
    QUERY_INTERRUPTED,
    QUEUE_TABLE,
    ROLLBACK_SQL,
    SCHEDULE_TABLE,
    START_TRANSACTION_SQL,
    WORKER_TABLE,
    connection_for,
    default_alias,
    error_code,
    logger,
    micros,
    with_lock_retry,
)
from .isolation import transaction_prelude
from .lockwait import bounded_statement
from .session import connection_session

#: The rate-limit keys (``rates``).
RATE_TABLE = "mysqlq_rate"

LISTEN_SQL = f"""
UPDATE {WORKER_TABLE} SET listening = %s, connection_id = CONNECTION_ID(), node = %s
 WHERE id = %s
"""
#: Parked workers of a queue. Only rows renewed within a lease and since the server
#: started count: a dead worker's connection id may belong to someone else by now.
LISTENERS_SQL = f"""
SELECT id, connection_id, node FROM {WORKER_TABLE}
 WHERE listening = 1 AND stopped_at IS NULL AND FIND_IN_SET(%s, queues)
   AND last_heartbeat > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND
"""
#: Ends a parked worker's SLEEP (the statement only: its connection stays).
KILL_QUERY_SQL = "KILL QUERY %s"
#: On a cluster, a parked worker's hold on its own row while it sleeps; ``listening`` 0
#: means a producer rang while it was between parks.
HOLD_OWN_ROW_SQL = f"SELECT listening FROM {WORKER_TABLE} WHERE id = %s FOR UPDATE"
#: On a cluster, wakes a worker parked on another node: the change, applied there, aborts
#: the parked worker's hold on its row and with it the SLEEP.
RING_SQL = f"UPDATE {WORKER_TABLE} SET listening = 0 WHERE id = %s AND listening = 1"
#: Seconds until the next occurrence of a live schedule is due (``schedules``), or a large
#: number: a schedule that can fire ends a park as a due scheduled message does. A row
#: without a time counts as due, so a worker repairs it; paused, removed and broken ones
#: don't count, or a park would end at once, again and again.
_SCHEDULE_WAIT = f"""COALESCE((
    SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6),
                         MIN(COALESCE(next_run_at, UTC_TIMESTAMP(6)))) / 1000000
      FROM {SCHEDULE_TABLE} WHERE paused = 0 AND removed_at IS NULL AND error = ''),
    1000000000)"""
#: Whether the rate key of the row ``r`` has a throttled message a worker may claim (the
#: parameter: it runs nothing, so it may take one lost with a worker before, as
#: ``rates.NEXT_THROTTLED_SQL`` does). A scalar subquery, one dive into the key's messages
#: per row: written as EXISTS, the optimizer made it a semi-join that materialized every
#: throttled message, reading the whole messages table at every claim and park.
CLAIMABLE_IN_KEY = f"""(SELECT 1 FROM {MESSAGE_TABLE} AS m FORCE INDEX (mysqlq_msg_rate)
        WHERE m.rate_key = r.rate_key AND m.queue = r.queue
          AND m.status = '{MessageStatus.THROTTLED}' AND (m.losses = 0 OR %s)
        LIMIT 1) IS NOT NULL"""
#: Seconds until the earliest start a key of these queues with throttled messages may
#: make (negative: now), or NULL: a parked worker's park ends then (``park``). A parked
#: worker runs nothing, so it may claim any of them (the parameter is true): what this
#: calls due, its claim takes (``rates.DUE_KEYS_SQL``), or its parks would end at once,
#: again and again.
RATE_WAIT = f"""(
    SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(r.next_at)) / 1000000
      FROM {RATE_TABLE} AS r FORCE INDEX (mysqlq_rate_due)
     WHERE r.queue IN ({{rate_queues}}) AND {CLAIMABLE_IN_KEY})"""
#: Parks an idle worker: returns at once if its queues have ready messages (past those
#: it could not claim: ``ready_floor``), a scheduled message or a schedule's occurrence
#: is due, else sleeps (at most %s seconds, or until the next one is due: then 'due'
#: too) until a producer's KILL QUERY cuts the SLEEP short. The check and the sleep are
#: one statement, so a wake-up can't fall between them.
_IDLE_WAIT_SQL = f"""
SELECT CASE
         WHEN %s = 'leader' AND {{leader_due}} THEN 'sweep'
         WHEN %s = 'follower' AND {{follower_due}} THEN 'sweep'
         WHEN EXISTS (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
                       WHERE queue IN ({{queues}}) AND status = 'ready' AND id > %s)
              THEN 'ready'
         WHEN due.wait <= 0 THEN 'due'
         WHEN SLEEP(LEAST(%s, due.wait)) = 1 THEN 'woken'
         WHEN due.wait < %s THEN 'due'
         ELSE 'slept'
       END,
       (SELECT COALESCE(GROUP_CONCAT(queue ORDER BY queue SEPARATOR ','), '')
          FROM {QUEUE_TABLE} WHERE paused = 1 AND queue IN ({{queues}}))
  FROM (SELECT LEAST(COALESCE(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(run_at))
                              / 1000000, %s), {_SCHEDULE_WAIT},
                    COALESCE({{rate_wait}}, 1000000000)) AS wait
          FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
         WHERE status = 'scheduled') AS due
"""


def listen(worker_id: str, listening: bool) -> None:
    """Say whether this worker is parked (and on which connection) for producers to wake.

    Never behind a proxy: the connection id would be a backend's, maybe another client's.
    On a cluster the row also says which node the connection is on.
    """
    session = connection_session()
    listening = listening and session.direct

    def run() -> None:
        with connection_for().cursor() as cursor:
            cursor.execute(LISTEN_SQL, [listening, session.node, worker_id])

    with_lock_retry(default_alias(), run)


def idle_wait(queues: Sequence[str], seconds: float, sweep_check: str = "",
              watched: Sequence[str] = (), worker_id: str | None = None,
              rates: bool = False, lock_wait: int | None = None,
              ready_after: int = 0) -> tuple[str, str | None]:
    """Park until woken, work is ready or ``seconds`` pass: ``ready``, ``due`` (at once,
    or after sleeping until it came due), ``woken`` (``interrupted`` if the wake-up came
    before the statement's checks ran) or ``slept`` (the whole ``seconds``: nothing came
    due, nobody woke it, so there is nothing new to claim); with the paused ones among
    the ``watched`` queues as they were when it returned (comma-separated, None when
    interrupted), so a parked worker sees a pause for free.

    ``sweep_check`` folds the recovery duty into the park, so an idle cluster pays no
    separate sweep: ``leader`` returns ``sweep`` at once if any message is claimed (there
    may be a dead owner to judge; on a Galera cluster: a lease ran out, or the leader's
    own lease needs renewing), ``follower`` if the recovery lock is free (the leader is
    gone). Both are checked when the statement starts, before it sleeps. On a cluster,
    ``worker_id`` names the row the park holds for producers on other nodes to ring.
    With ``rates`` (a worker that claims throttled messages) the park also ends when a
    rate-limited key of its queues may start its next message (``RATE_WAIT``), and
    ``lock_wait`` bounds its wait for the tables' metadata locks (a stranger's ``LOCK
    TABLES`` on the rate keys; MariaDB): the lock-wait timeout is raised. Ready messages
    with ids up to ``ready_after`` don't count (``ready_floor``).
    """
    session = connection_session()
    leader_due, leader_params, follower_due, follower_params = leader.park_checks(session)
    watched = list(watched) or list(queues)
    sql = _IDLE_WAIT_SQL.replace("{leader_due}", leader_due).replace(
        "{follower_due}", follower_due).replace(
        "{queues}", ", ".join(["%s"] * len(queues)), 1).replace(
        "{queues}", ", ".join(["%s"] * len(watched)), 1).replace(
        "{rate_wait}", RATE_WAIT.replace("{rate_queues}", ", ".join(["%s"] * len(queues)))
        if rates else "NULL")
    params = [sweep_check, *leader_params, sweep_check, *follower_params, *queues,
              ready_after, seconds, seconds, *watched, seconds,
              *([*queues, True] if rates else [])]
    connection = connection_for()
    sql = bounded_statement(connection, sql, lock_wait)
    held = session.cluster and worker_id is not None
    try:
        with connection.cursor() as cursor:
            if held:
                prelude = transaction_prelude(connection)
                if prelude is not None:
                    cursor.execute(prelude)
                cursor.execute(START_TRANSACTION_SQL)
                try:
                    cursor.execute(HOLD_OWN_ROW_SQL, [worker_id])
                    row = cursor.fetchone()
                    if row is not None and not row[0]:
                        return "woken", None  # rung between two parks
                    # (No row: nothing to ring either; it parks as it would anyway.)
                    return _park(cursor, sql, params)
                finally:
                    try:
                        cursor.execute(ROLLBACK_SQL)
                    except DatabaseError:
                        pass  # the connection is gone, and with it the hold
            return _park(cursor, sql, params)
    except OperationalError as exc:
        if error_code(exc) == QUERY_INTERRUPTED:  # killed before SLEEP itself began
            return "interrupted", None
        if held and error_code(exc) == DEADLOCK:  # rung from another node: hold aborted
            return "woken", None
        raise


#: The highest id of the ready messages of these queues (0: none).
READY_FLOOR_SQL = f"""
SELECT COALESCE(MAX(id), 0) FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
 WHERE queue IN ({{queues}}) AND status = 'ready'
"""


def ready_floor(queues: Sequence[str]) -> int:
    """The highest id among the ready messages of ``queues``: read when a park said
    ``ready`` and the claim that followed may take none of them (another transaction
    holds their rows: a ``SELECT … FOR UPDATE`` left open). The next parks pass over
    them (``idle_wait``'s ``ready_after``): they would end at once, again and again, the
    worker going round without a pause while those rows stay locked. A message enqueued
    later has a higher id; one that becomes ready otherwise (recovered, resumed) wakes
    the parked workers."""
    if not queues:
        return 0

    def run() -> int:
        with connection_for().cursor() as cursor:
            cursor.execute(READY_FLOOR_SQL.format(queues=", ".join(["%s"] * len(queues))),
                           list(queues))
            return int(cursor.fetchone()[0])

    return with_lock_retry(default_alias(), run)


def _park(cursor: Any, sql: str, params: list[Any]) -> tuple[str, str | None]:
    cursor.execute(sql, params)
    state, paused = cursor.fetchone()
    return str(state), str(paused)


#: The queues of these messages that are ready now (recovered, given back).
READY_QUEUES_SQL = f"SELECT queue FROM {MESSAGE_TABLE} WHERE status = 'ready' AND id IN ({{ids}})"


def wake_for(message_ids: Sequence[int], alias: str | None = None) -> int:
    """Wake parked workers for messages that became ready without an enqueue (a recovery
    gave them back): they would otherwise wait for the end of a park to see them."""
    if not message_ids or not get_settings().WAKEUP:
        return 0
    alias = alias or default_alias()
    try:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(READY_QUEUES_SQL.format(ids=", ".join(["%s"] * len(message_ids))),
                           list(message_ids))
            queues = [str(row[0]) for row in cursor.fetchall()]
        return wake(queues, alias)
    except DatabaseError as exc:  # they are ready; workers find them at their next park
        logger.warning("Could not wake idle workers for recovered messages (%s).", exc)
        return 0


class _WakeState:
    """Per producer process: when each queue was last seen without listeners."""

    #: Seconds a 'nobody is listening' answer is trusted; parked workers' first sleeps
    #: are shorter than this plus their recheck, so no message waits on a stale answer.
    QUIET_SECONDS = 0.02

    def __init__(self) -> None:
        self.quiet_since: dict[tuple[str, str], float] = {}
        #: Aliases where this user may not KILL: wake-ups are off there only.
        self.disabled: set[str] = set()


_wake_state = _WakeState()


def wake(queues: Sequence[str], alias: str | None = None, *, everyone: bool = False) -> int:
    """Wake workers parked on these queues (after a commit); return how many were woken.

    Each entry of ``queues`` stands for one new message there. Per queue, at most that
    many listeners plus one are woken, picked at random so no worker is always the one:
    one woken worker claims a whole batch, and waking every listener for each message
    only makes the rest wake, find nothing and park again (a KILL per listener per
    message). The one spare covers a listener that is stopping or just left its park.
    ``everyone`` wakes every listener instead: a pause or resume, which all of them must
    re-read.
    """
    alias = alias or default_alias()
    state = _wake_state
    conf = get_settings()
    if alias in state.disabled or not conf.WAKEUP:
        return 0
    now = time.monotonic()
    new_messages = Counter(queues)
    # Most enqueues of a busy producer end here: nobody listened a moment ago.
    unknown = [queue for queue in new_messages
               if now - state.quiet_since.get((alias, queue), -1.0) >= state.QUIET_SECONDS]
    if not unknown:
        return 0
    woken: set[str] = set()
    session = connection_session(alias)
    if not session.direct:
        return 0  # behind a proxy: a KILL QUERY could end another client's statement
    recent = conf.LEASE_SECONDS
    if not session.cluster:  # (on a cluster, node identities tell restarts apart)
        recent = min(recent, max(0.0, time.time() - session.server_start))
    with connection_for(alias).cursor() as cursor:
        for queue in unknown:
            key = (alias, queue)
            cursor.execute(LISTENERS_SQL, [queue, micros(recent)])
            listeners = [(str(row[0]), int(row[1] or 0), str(row[2] or ""))
                         for row in cursor.fetchall() if row[1] or session.cluster]
            if not listeners:
                state.quiet_since[key] = now
                continue
            state.quiet_since.pop(key, None)
            random.shuffle(listeners)
            wanted = len(listeners) if everyone else new_messages[queue] + 1
            for worker_id, connection_id, node in listeners:
                if wanted <= 0:
                    break
                if worker_id in woken:  # woken for another queue: it claims from both
                    wanted -= 1
                    continue
                if connection_id == session.connection_id and node == session.node:
                    # Ourselves (a member pumping just before its park): not asleep, and a
                    # KILL QUERY of our own connection would end this statement instead.
                    woken.add(worker_id)
                    wanted -= 1
                    continue
                if node != session.node:  # parked on another node: its id means nothing here
                    if _ring(alias, worker_id):
                        woken.add(worker_id)
                        wanted -= 1
                    continue
                try:
                    cursor.execute(KILL_QUERY_SQL, [connection_id])
                except OperationalError as exc:
                    if error_code(exc) == 1094:  # that worker is gone already
                        continue
                    state.disabled.add(alias)
                    logger.warning(
                        "Can't wake idle workers on database %s (%s): this database user "
                        "may not KILL their queries. Its workers fall back to polling (the "
                        "other databases' keep their wake-ups); give the user the "
                        "CONNECTION ADMIN privilege, run workers as the same user, or set "
                        "MYSQLQ['WAKEUP'] = False.", alias, exc)
                    return len(woken)
                woken.add(worker_id)
                wanted -= 1
    return len(woken)


def _ring(alias: str, worker_id: str) -> bool:
    """Wake a worker parked on another node of the cluster through its row; False if it
    was no longer listening (another producer rang first, or it left its park)."""
    def run() -> bool:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(RING_SQL, [worker_id])
            return bool(cursor.rowcount)

    # Rung from two nodes at once, one conflicts at commit: its retry finds it rung.
    return with_lock_retry(alias, run)
