"""Idle workers park in one ``SELECT … SLEEP()``; producers wake them with ``KILL QUERY``."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence

from django.db import OperationalError

from ..conf import get_settings
from ..models import CLAIM_INDEX
from .base import (
    MESSAGE_TABLE,
    QUERY_INTERRUPTED,
    QUEUE_TABLE,
    RECOVERY_LOCK_NAME,
    SCHEDULE_TABLE,
    WORKER_TABLE,
    connection_for,
    default_alias,
    error_code,
    logger,
    micros,
    with_lock_retry,
)
from .session import connection_session

LISTEN_SQL = f"""
UPDATE {WORKER_TABLE} SET listening = %s, connection_id = CONNECTION_ID() WHERE id = %s
"""
#: Parked workers of a queue. Only rows renewed within a lease and since the server
#: started count: a dead worker's connection id may belong to someone else by now.
LISTENERS_SQL = f"""
SELECT connection_id FROM {WORKER_TABLE}
 WHERE listening = 1 AND stopped_at IS NULL AND FIND_IN_SET(%s, queues)
   AND last_heartbeat > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND
"""
#: Ends a parked worker's SLEEP (the statement only: its connection stays).
KILL_QUERY_SQL = "KILL QUERY %s"
#: Seconds until the next occurrence of a live schedule is due (``schedules``), or a large
#: number: a schedule that can fire ends a park as a due scheduled message does. A row
#: without a time counts as due, so a worker repairs it; paused, removed and broken ones
#: don't count, or a park would end at once, again and again.
_SCHEDULE_WAIT = f"""COALESCE((
    SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6),
                         MIN(COALESCE(next_run_at, UTC_TIMESTAMP(6)))) / 1000000
      FROM {SCHEDULE_TABLE} WHERE paused = 0 AND removed_at IS NULL AND error = ''),
    1000000000)"""
#: Parks an idle worker: returns at once if its queues have ready messages, a scheduled
#: message or a schedule's occurrence is due, else sleeps (at most %s seconds, or until
#: the next one is due) until a producer's KILL QUERY cuts the SLEEP short. The check and
#: the sleep are one statement, so a wake-up can't fall between them.
_IDLE_WAIT_SQL = f"""
SELECT CASE
         WHEN %s = 'leader' AND EXISTS (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_lease)
                                          WHERE status = 'claimed') THEN 'sweep'
         WHEN %s = 'follower' AND IS_FREE_LOCK({RECOVERY_LOCK_NAME}) = 1 THEN 'sweep'
         WHEN EXISTS (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})
                       WHERE queue IN ({{queues}}) AND status = 'ready') THEN 'ready'
         WHEN due.wait <= 0 THEN 'due'
         WHEN SLEEP(LEAST(%s, due.wait)) = 1 THEN 'woken'
         ELSE 'slept'
       END,
       (SELECT COALESCE(GROUP_CONCAT(queue ORDER BY queue SEPARATOR ','), '')
          FROM {QUEUE_TABLE} WHERE paused = 1 AND queue IN ({{queues}}))
  FROM (SELECT LEAST(COALESCE(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(run_at))
                              / 1000000, %s), {_SCHEDULE_WAIT}) AS wait
          FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_due)
         WHERE status = 'scheduled') AS due
"""


def listen(worker_id: str, listening: bool) -> None:
    """Say whether this worker is parked (and on which connection) for producers to wake.

    Never behind a proxy: the connection id would be a backend's, maybe another client's.
    """
    listening = listening and connection_session().direct

    def run() -> None:
        with connection_for().cursor() as cursor:
            cursor.execute(LISTEN_SQL, [listening, worker_id])

    with_lock_retry(default_alias(), run)


def idle_wait(queues: Sequence[str], seconds: float, sweep_check: str = "",
              watched: Sequence[str] = ()) -> tuple[str, str | None]:
    """Park until woken, work is ready or ``seconds`` pass: ``ready``, ``due``, ``woken``
    (``interrupted`` if the wake-up came before the statement's checks ran) or ``slept``;
    with the paused ones among the ``watched`` queues as they were when it returned
    (comma-separated, None when interrupted), so a parked worker sees a pause for free.

    ``sweep_check`` folds the recovery duty into the park, so an idle cluster pays no
    separate sweep: ``leader`` returns ``sweep`` at once if any message is claimed (there
    may be a dead owner to judge), ``follower`` if the recovery lock is free (the leader
    is gone). Both are checked when the statement starts, before it sleeps.
    """
    watched = list(watched) or list(queues)
    sql = _IDLE_WAIT_SQL.replace("{queues}", ", ".join(["%s"] * len(queues)), 1).replace(
        "{queues}", ", ".join(["%s"] * len(watched)), 1)
    try:
        with connection_for().cursor() as cursor:
            cursor.execute(sql, [sweep_check, sweep_check, *queues, seconds, *watched,
                                 seconds])
            state, paused = cursor.fetchone()
            return str(state), str(paused)
    except OperationalError as exc:
        if error_code(exc) == QUERY_INTERRUPTED:  # killed before SLEEP itself began
            return "interrupted", None
        raise


class _WakeState:
    """Per producer process: when each queue was last seen without listeners."""

    #: Seconds a 'nobody is listening' answer is trusted; parked workers' first sleeps
    #: are shorter than this plus their recheck, so no message waits on a stale answer.
    QUIET_SECONDS = 0.02

    def __init__(self) -> None:
        self.quiet_since: dict[tuple[str, str], float] = {}
        self.disabled = False


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
    if state.disabled or not conf.WAKEUP:
        return 0
    now = time.monotonic()
    new_messages = Counter(queues)
    # Most enqueues of a busy producer end here: nobody listened a moment ago.
    unknown = [queue for queue in new_messages
               if now - state.quiet_since.get((alias, queue), -1.0) >= state.QUIET_SECONDS]
    if not unknown:
        return 0
    woken: set[int] = set()
    session = connection_session(alias)
    if not session.direct:
        return 0  # behind a proxy: a KILL QUERY could end another client's statement
    recent = min(conf.LEASE_SECONDS, max(0.0, time.time() - session.server_start))
    with connection_for(alias).cursor() as cursor:
        for queue in unknown:
            key = (alias, queue)
            cursor.execute(LISTENERS_SQL, [queue, micros(recent)])
            listeners = [int(row[0]) for row in cursor.fetchall() if row[0]]
            if not listeners:
                state.quiet_since[key] = now
                continue
            state.quiet_since.pop(key, None)
            random.shuffle(listeners)
            wanted = len(listeners) if everyone else new_messages[queue] + 1
            for connection_id in listeners:
                if wanted <= 0:
                    break
                if connection_id in woken:  # woken for another queue: it claims from both
                    wanted -= 1
                    continue
                try:
                    cursor.execute(KILL_QUERY_SQL, [connection_id])
                except OperationalError as exc:
                    if error_code(exc) == 1094:  # that worker is gone already
                        continue
                    state.disabled = True
                    logger.warning(
                        "Can't wake idle workers (%s): this database user may not KILL "
                        "their queries. Workers fall back to polling; give the user the "
                        "CONNECTION ADMIN privilege, run workers as the same user, or set "
                        "MYSQLQ['WAKEUP'] = False.", exc)
                    return len(woken)
                woken.add(connection_id)
                wanted -= 1
    return len(woken)
