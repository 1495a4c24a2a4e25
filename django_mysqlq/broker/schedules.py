"""Recurring tasks: the schedule rows, and each occurrence enqueued exactly once.

Every worker does it, on the database clock. A due occurrence is enqueued by whichever
worker's conditional ``UPDATE … WHERE name = %s AND next_run_at <=> %s`` matches first:
it moves ``next_run_at`` on and inserts the message in the same transaction, so a racing
worker's update waits for that commit, then matches nothing. No named lock: ``GET_LOCK``
is refused or node-local on Galera, where the same update loses at certification instead
(a deadlock error, retried, that then matches nothing). The update waits at most
``locked.LOCK_WAIT_SECONDS`` on a row a stranger holds; that schedule is tried again at
the next check.

``next_run_at`` is compared as text: a value changed by hand into one the driver can't
read (a zero date) still matches, so the check can repair it instead of finding the same
row due again and again. Idle workers' parks end when a schedule is due (``park``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from django.db import OperationalError, transaction

from .. import cron
from ..signals import message_enqueued
from .base import (
    DEADLOCK,
    MESSAGE_TABLE,
    NOW_SQL,
    SCHEDULE_TABLE,
    connection_for,
    default_alias,
    error_code,
    in_transaction,
    logger,
    naive_utc,
    placeholders,
    send_robust,
    stats,
    with_lock_retry,
)
from .locked import LOCK_WAIT_TIMEOUT, short_wait
from .park import wake

#: A schedule as a starting worker's code declares it: the row it writes.
SYNC_SQL = f"""
INSERT INTO {SCHEDULE_TABLE}
       (name, source, task_name, queue, priority, max_attempts, retry_backoff, timeout,
        payload, cron, timezone, catch_up, paused, next_run_at, created_at, declared_at,
        error, changed_by)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, %s, UTC_TIMESTAMP(6),
        UTC_TIMESTAMP(6), '', '')
ON DUPLICATE KEY UPDATE
       next_run_at = IF(cron = VALUES(cron) AND timezone = VALUES(timezone) AND error = ''
                          AND removed_at IS NULL AND next_run_at IS NOT NULL
                          AND next_run_at <= VALUES(next_run_at),
                        next_run_at, VALUES(next_run_at)),
       source = VALUES(source), task_name = VALUES(task_name), queue = VALUES(queue),
       priority = VALUES(priority), max_attempts = VALUES(max_attempts),
       retry_backoff = VALUES(retry_backoff), timeout = VALUES(timeout),
       payload = VALUES(payload), cron = VALUES(cron), timezone = VALUES(timezone),
       catch_up = VALUES(catch_up), declared_at = VALUES(declared_at), removed_at = NULL,
       error = ''
"""
#: A declared schedule no worker has written yet (``queueschedule`` before any worker
#: started): inserted as a starting worker would, an existing row left as it is.
ADD_MISSING_SQL = f"""
INSERT IGNORE INTO {SCHEDULE_TABLE}
       (name, source, task_name, queue, priority, max_attempts, retry_backoff, timeout,
        payload, cron, timezone, catch_up, paused, next_run_at, created_at, declared_at,
        error, changed_by)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, %s, UTC_TIMESTAMP(6),
        UTC_TIMESTAMP(6), '', '')
"""
#: Rows no longer declared by the code of the worker that starts: they stop firing.
MARK_REMOVED_SQL = f"""
UPDATE {SCHEDULE_TABLE} SET removed_at = UTC_TIMESTAMP(6)
 WHERE removed_at IS NULL {{keep}}
"""
KNOWN_SQL = f"SELECT name, cron, timezone, removed_at IS NOT NULL FROM {SCHEDULE_TABLE}"

#: Schedules with an occurrence due (or a ``next_run_at`` to repair), and the time.
DUE_SQL = f"""
SELECT name, cron, timezone, catch_up, CAST(next_run_at AS CHAR(26)),
       CAST(last_run_at AS CHAR(26)), CAST(created_at AS CHAR(26)), queue, task_name,
       UTC_TIMESTAMP(6)
  FROM {SCHEDULE_TABLE}
 WHERE paused = 0 AND removed_at IS NULL AND error = ''
   AND (next_run_at IS NULL OR next_run_at <= UTC_TIMESTAMP(6))
 ORDER BY name
"""
#: Takes the occurrences for this worker: only one worker's update matches.
ADVANCE_SQL = f"""
UPDATE {SCHEDULE_TABLE}
   SET next_run_at = %s, last_run_at = COALESCE(%s, last_run_at),
       last_enqueued_at = IF(%s, UTC_TIMESTAMP(6), last_enqueued_at)
 WHERE name = %s AND CAST(next_run_at AS CHAR(26)) <=> %s AND cron = %s AND timezone = %s
   AND catch_up = %s AND paused = 0 AND removed_at IS NULL AND error = ''
"""
#: One occurrence's message, made from the row (locked by ADVANCE_SQL): its run_at is
#: the occurrence, so the queue shows which one it is; it is ready at once.
OCCURRENCE_SQL = f"""
INSERT INTO {MESSAGE_TABLE}
       (queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, dedup_key,
        enqueued_at, run_at, status, attempts, last_error)
SELECT queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, NULL,
       UTC_TIMESTAMP(6), %s, 'ready', 0, ''
  FROM {SCHEDULE_TABLE}
 WHERE name = %s
"""
LAST_MESSAGE_SQL = f"UPDATE {SCHEDULE_TABLE} SET last_message_id = %s WHERE name = %s"
#: A row whose expression or zone this worker can't use: it stops firing, with why.
BROKEN_SQL = f"""
UPDATE {SCHEDULE_TABLE} SET error = %s
 WHERE name = %s AND cron = %s AND timezone = %s AND error = ''
"""

PAUSE_SQL = f"""
UPDATE {SCHEDULE_TABLE} SET paused = 1, changed_at = UTC_TIMESTAMP(6), changed_by = %s
 WHERE name IN ({{names}}) AND paused = 0
"""
#: A resumed schedule starts from now: occurrences of the pause are not caught up.
LOCK_PAUSED_SQL = f"""
SELECT name, cron, timezone, UTC_TIMESTAMP(6) FROM {SCHEDULE_TABLE}
 WHERE name IN ({{names}}) AND paused = 1
 ORDER BY name
   FOR UPDATE
"""
RESUME_SQL = f"""
UPDATE {SCHEDULE_TABLE}
   SET paused = 0, next_run_at = %s, error = %s, changed_at = UTC_TIMESTAMP(6),
       changed_by = %s
 WHERE name = %s
"""
PRUNE_SQL = f"DELETE FROM {SCHEDULE_TABLE} WHERE removed_at IS NOT NULL {{names}}"
#: An operator's extra run: the schedule's message now, its occurrences left as they are.
RUN_NOW_SQL = f"""
INSERT INTO {MESSAGE_TABLE}
       (queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, dedup_key,
        enqueued_at, run_at, status, attempts, last_error)
SELECT queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, NULL,
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'ready', 0, ''
  FROM {SCHEDULE_TABLE}
 WHERE name = %s
"""
RUN_NOW_QUEUE_SQL = f"SELECT queue, task_name FROM {SCHEDULE_TABLE} WHERE name = %s"


@dataclasses.dataclass(frozen=True)
class DeclaredSchedule:
    """What a worker's code says of one schedule, ready to be written as its row."""

    name: str
    source: str
    task_name: str
    queue: str
    priority: int
    max_attempts: int
    retry_backoff: float
    timeout: float | None
    payload: str
    cron: str
    timezone: str
    catch_up: str


@dataclasses.dataclass(frozen=True)
class Synced:
    """What a sync changed, by schedule name."""

    added: list[str]
    changed: list[str]
    removed: list[str]


def sync(declared: Sequence[DeclaredSchedule], alias: str | None = None) -> Synced:
    """Write the schedules this worker's code declares; mark the others removed.

    A schedule keeps its ``next_run_at`` (and so its catch-up) unless its expression or
    zone changed, it was removed or broken, or the value is wrong (none, or later than
    the expression's next occurrence): then it starts from the next occurrence after now.
    """
    alias = alias or default_alias()
    ordered = sorted(declared, key=lambda schedule: schedule.name)

    def body(cursor: Any) -> Synced:
        cursor.execute(KNOWN_SQL)
        known = {str(row[0]): (str(row[1]), str(row[2]), bool(row[3]))
                 for row in cursor.fetchall()}
        cursor.execute(NOW_SQL)
        now = cursor.fetchone()[0]
        for schedule in ordered:
            cursor.execute(SYNC_SQL, _row_params(schedule, now))
        names = [schedule.name for schedule in ordered]
        keep = f"AND name NOT IN ({placeholders(len(names))})" if names else ""
        cursor.execute(MARK_REMOVED_SQL.format(keep=keep), names)
        return Synced(
            added=[name for name in names if name not in known],
            changed=[s.name for s in ordered if s.name in known
                     and known[s.name] != (s.cron, s.timezone, False)],
            removed=sorted(name for name, (_, _, gone) in known.items()
                           if name not in names and not gone))

    return in_transaction(alias, body)


def _row_params(schedule: DeclaredSchedule, now: Any) -> list[Any]:
    """A declared schedule's row for ``SYNC_SQL`` and ``ADD_MISSING_SQL``, its next run
    computed from the database's ``now``."""
    following = cron.Cron.parse(schedule.cron, schedule.timezone).after(now)
    return [schedule.name, schedule.source, schedule.task_name, schedule.queue,
            schedule.priority, schedule.max_attempts, schedule.retry_backoff,
            schedule.timeout, schedule.payload, schedule.cron, schedule.timezone,
            schedule.catch_up, naive_utc(following)]


def add_missing(declared: Sequence[DeclaredSchedule], alias: str | None = None) -> list[str]:
    """Write the declared schedules that have no row yet (as a starting worker would);
    leave every existing row, and the ones no longer declared, as they are. Returns the
    names added."""
    alias = alias or default_alias()

    def body(cursor: Any) -> list[str]:
        cursor.execute(NOW_SQL)
        now = cursor.fetchone()[0]
        added = []
        for schedule in sorted(declared, key=lambda schedule: schedule.name):
            cursor.execute(ADD_MISSING_SQL, _row_params(schedule, now))
            if cursor.rowcount:
                added.append(schedule.name)
        return added

    return in_transaction(alias, body)


@dataclasses.dataclass(frozen=True)
class Fired:
    """One schedule's check that enqueued something (or dropped missed occurrences)."""

    name: str
    task_name: str
    queue: str
    occurrences: list[dt.datetime]
    message_ids: list[int]
    next_run_at: dt.datetime
    plan: cron.Plan
    catch_up: str
    timezone: str


def _parsed(text: object) -> dt.datetime | None:
    """A DATETIME(6) read as text, as aware UTC; None for NULL or a value that is no date."""
    if text is None:
        return None
    try:
        return dt.datetime.fromisoformat(str(text)).replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def fire_due(grace: float, limit: int = cron.CATCH_UP_LIMIT,
             alias: str | None = None) -> list[Fired]:
    """Enqueue the due occurrences of every schedule; return what was enqueued.

    A schedule whose first pending occurrence is older than ``grace`` seconds missed
    occurrences (no worker ran): its ``catch_up`` policy says which of them are enqueued.
    """
    alias = alias or default_alias()
    with connection_for(alias).cursor() as cursor:
        cursor.execute(DUE_SQL)
        rows = cursor.fetchall()
    fired = []
    for row in rows:
        result = _fire_one(alias, row, grace, limit)
        if result is not None:
            fired.append(result)
    return fired


def _fire_one(alias: str, row: Sequence[Any], grace: float, limit: int) -> Fired | None:
    name, expression, zone, catch_up, next_text, last_text, created_text = row[:7]
    queue, task_name, now = str(row[7]), str(row[8]), row[9].replace(tzinfo=dt.UTC)
    try:
        if catch_up not in cron.CATCH_UP_POLICIES:
            raise cron.CronError(cron.catch_up_problem(catch_up) or "")
        schedule = cron.Cron.parse(expression, zone)
        pending = _parsed(next_text)
        last, created = _parsed(last_text), _parsed(created_text)
        if pending is not None:
            # Never again an occurrence already enqueued, nor one before the row existed.
            if last is not None:
                pending = max(pending, last + dt.timedelta(microseconds=1))
            if created is not None:
                pending = max(pending, created)
        plan = cron.plan(schedule, pending, now, str(catch_up), grace, limit)
    except cron.CronError as exc:
        _mark_broken(alias, name, expression, zone, str(exc))
        return None
    ids = _take(alias, name, next_text, expression, zone, str(catch_up), plan)
    if ids is None:
        return None  # another worker took them (or a stranger holds the row)
    if ids:
        wake([queue] * len(ids), alias)
        send_robust(message_enqueued, task_name, message_ids=ids)
    return Fired(name=str(name), task_name=task_name, queue=queue, occurrences=plan.fire,
                 message_ids=ids, next_run_at=plan.next_run_at, plan=plan,
                 catch_up=str(catch_up), timezone=str(zone))


def _take(alias: str, name: str, next_text: object, expression: str, zone: str,
          catch_up: str, plan: cron.Plan) -> list[int] | None:
    """Move the schedule on and insert its occurrences in one transaction; None if another
    worker did it first (or the row is locked by a stranger: try again later)."""
    connection = connection_for(alias)
    last = naive_utc(plan.fire[-1]) if plan.fire else None

    def body(cursor: Any) -> list[int] | None:
        cursor.execute(short_wait(connection, ADVANCE_SQL), [
            naive_utc(plan.next_run_at), last, last is not None, name, next_text,
            expression, zone, catch_up])
        if cursor.rowcount != 1:
            return None
        ids = []
        for occurrence in plan.fire:
            cursor.execute(OCCURRENCE_SQL, [naive_utc(occurrence), name])
            ids.append(int(cursor.lastrowid))
        if ids:
            cursor.execute(LAST_MESSAGE_SQL, [ids[-1], name])
        return ids

    try:
        return with_lock_retry(alias, lambda: _in_own_transaction(alias, body),
                               codes=frozenset({DEADLOCK}))
    except OperationalError as exc:
        if error_code(exc) != LOCK_WAIT_TIMEOUT:
            raise
        stats.count(LOCK_WAIT_TIMEOUT)
        logger.warning("Schedule %r: its row is locked by another transaction; its due "
                       "occurrence is enqueued at a later check.", name)
        return None


def _in_own_transaction(alias: str,
                        body: Callable[[Any], list[int] | None]) -> list[int] | None:
    """``in_transaction`` without its retries: the caller retries deadlocks only."""
    with transaction.atomic(using=alias), connection_for(alias).cursor() as cursor:
        return body(cursor)


def _mark_broken(alias: str, name: str, expression: str, zone: str, problem: str) -> None:
    logger.error("Schedule %r can't fire: %s. It is skipped until a worker whose code "
                 "declares it starts (and writes its row again), or it is fixed by hand.",
                 name, problem)

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(BROKEN_SQL, [problem[:2000], name, expression, zone])
            return int(cursor.rowcount)

    with_lock_retry(alias, run)


def set_paused(names: Sequence[str], paused: bool, actor: str,
               alias: str | None = None) -> list[str]:
    """Pause or resume schedules; return the names that changed.

    A resumed schedule's next occurrence is the first one after now: occurrences that
    fell in the pause are not caught up.
    """
    alias = alias or default_alias()
    names = sorted(set(names))
    if not names:
        return []

    def pause(cursor: Any) -> list[str]:
        changed = []
        for name in names:  # one by one, to tell which changed
            cursor.execute(PAUSE_SQL.format(names="%s"), [actor, name])
            if cursor.rowcount:
                changed.append(name)
        return changed

    def resume(cursor: Any) -> list[str]:
        cursor.execute(LOCK_PAUSED_SQL.format(names=placeholders(len(names))), names)
        changed = []
        for name, expression, zone, now in cursor.fetchall():
            try:
                following: dt.datetime | None = cron.Cron.parse(expression, zone).after(now)
                problem = ""
            except cron.CronError as exc:
                following, problem = None, str(exc)
            cursor.execute(RESUME_SQL, [following and naive_utc(following), problem[:2000],
                                        actor, name])
            changed.append(str(name))
        return changed

    return in_transaction(alias, pause if paused else resume)


def prune(names: Sequence[str] | None = None, alias: str | None = None) -> int:
    """Delete removed schedules (all of them for None, else these); return how many went.

    An empty ``names`` deletes nothing: an admin selection that matched no row (a second
    POST of the same prune) must not turn into "every removed schedule".
    """
    alias = alias or default_alias()
    if names is not None and not names:
        return 0
    names = list(names or ())
    condition = f"AND name IN ({placeholders(len(names))})" if names else ""

    def run() -> int:
        with connection_for(alias).cursor() as cursor:
            cursor.execute(PRUNE_SQL.format(names=condition), names)
            return int(cursor.rowcount)

    return with_lock_retry(alias, run)


def run_now(name: str, alias: str | None = None) -> int | None:
    """Enqueue one run of a schedule's task now, as its occurrences are made; return the
    message id (None: no such schedule). The schedule's own times don't move."""
    alias = alias or default_alias()

    def body(cursor: Any) -> tuple[int, str, str] | None:
        cursor.execute(RUN_NOW_QUEUE_SQL, [name])
        row = cursor.fetchone()
        if row is None:
            return None
        cursor.execute(RUN_NOW_SQL, [name])
        return int(cursor.lastrowid), str(row[0]), str(row[1])

    made = in_transaction(alias, body)
    if made is None:
        return None
    message_id, queue, task_name = made
    wake([queue], alias)
    send_robust(message_enqueued, task_name, message_ids=[message_id])
    return message_id
