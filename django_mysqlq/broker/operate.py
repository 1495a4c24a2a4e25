"""What the admin and the CLI do to messages.

Every action locks the rows it may change (``FOR UPDATE``, only in the statuses it
allows: never ``claimed``), writes one history row per message naming the operator, and
changes the rows, in one transaction. A message a worker claims meanwhile is simply not
matched: actions never touch a message a live worker runs. The gates of the messages
(ordered subjects, concurrency keys) are locked first, and their counters kept right: a
cancelled head frees its subject, a requeued message without a slot takes its turn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, transaction

from ..conf import get_settings
from ..messages import NewMessage
from ..models import CANCELLABLE_STATUSES, OPERABLE_STATUSES, Outcome
from ..routing import alias_for_queue
from . import subjects
from .base import (
    ATTEMPT_TABLE,
    MESSAGE_TABLE,
    QUEUE_TABLE,
    RUNNABLE_STATUS,
    connection_for,
    default_alias,
    in_transaction,
    logger,
    placeholders,
    require_autocommit,
)
from .enqueue import enqueue
from .park import wake
from .recover import LOCKED_FATE_SQL, NOT_STARTED, RECOVER_SQL, live_connections, loss_reason
from .session import connection_session

#: Ids per operator transaction: bounds lock time and statement size.
OPERATOR_CHUNK = 500

OPERATOR_HISTORY_SQL = f"""
INSERT INTO {ATTEMPT_TABLE}
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload, actor)
SELECT id, queue, task_name, attempts, %s, priority, enqueued_at, NULL,
       UTC_TIMESTAMP(6), '', %s, %s, NULL, '', '', %s, '', NULL, IF(%s, payload, ''), %s
  FROM {MESSAGE_TABLE}
 WHERE id IN ({{ids}})
"""
#: The ``replayed`` history row of an operator's copy, linked to its original
#: (``replayed_from``) as ``queuepipeline replay`` links its copies: that job skips an
#: original history shows replayed, whichever way it was.
REPLAYED_HISTORY_SQL = f"""
INSERT INTO {ATTEMPT_TABLE}
       (message_id, queue, task_name, attempt, outcome, priority, enqueued_at, started_at,
        finished_at, worker_id, host, pid, connection_id, thread, error_class, error_message,
        traceback, result, payload, actor, replayed_from)
SELECT id, queue, task_name, attempts, %s, priority, enqueued_at, NULL,
       UTC_TIMESTAMP(6), '', %s, %s, NULL, '', '', %s, '', NULL, '', %s, %s
  FROM {MESSAGE_TABLE}
 WHERE id = %s
"""
_LOCK_OPERABLE_SQL = f"""
SELECT id, queue, status, gate_key, gate_mode FROM {MESSAGE_TABLE}
 WHERE id IN ({{ids}}) AND status IN ({{statuses}})
 ORDER BY id
   FOR UPDATE
"""
#: The gates of some messages, read without a lock before they are locked in order (a
#: message's gate never changes).
GATES_OF_SQL = f"""
SELECT queue, gate_key, gate_mode FROM {MESSAGE_TABLE}
 WHERE id IN ({{ids}}) AND gate_key IS NOT NULL
"""
#: Without a reset, a message out of attempts gets one more by raising its own limit, so
#: its attempts keep reading "3/3", never "3/2". MariaDB and MySQL assign left to right:
#: max_attempts is computed from the attempts before the reset.
REQUEUE_SQL = f"""
UPDATE {MESSAGE_TABLE}
   SET status = {RUNNABLE_STATUS}, run_at = UTC_TIMESTAMP(6),
       max_attempts = IF(%s, max_attempts,
                         GREATEST(max_attempts, LEAST(attempts + 1, 4294967295))),
       attempts = IF(%s, 0, attempts)
 WHERE id IN ({{ids}})
"""
CANCEL_SQL = f"DELETE FROM {MESSAGE_TABLE} WHERE id IN ({{ids}})"
PRIORITY_SQL = f"UPDATE {MESSAGE_TABLE} SET priority = %s WHERE id IN ({{ids}})"

#: Every claimed message with what an operator needs to judge it (walks mysqlq_msg_lease).
STUCK_CANDIDATES_SQL = f"""
SELECT id, claim_token, owner_connection, owner_server_start,
       lease_expires_at < UTC_TIMESTAMP(6) AS expired,
       timeout IS NOT NULL
         AND claimed_at + INTERVAL ROUND(timeout * 1000000) MICROSECOND
             < UTC_TIMESTAMP(6) AS overran
  FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_lease)
 WHERE status = 'claimed'
"""
_LOCK_CLAIMED_SQL = f"""
SELECT claim_token, owner_connection, owner_server_start,
       lease_expires_at < UTC_TIMESTAMP(6), gate_mode
  FROM {MESSAGE_TABLE}
 WHERE id = %s AND status = 'claimed'
   FOR UPDATE
"""

SET_PAUSED_SQL = f"""
INSERT INTO {QUEUE_TABLE} (queue, paused, changed_at, changed_by)
VALUES (%s, %s, UTC_TIMESTAMP(6), %s)
ON DUPLICATE KEY UPDATE paused = VALUES(paused), changed_at = VALUES(changed_at),
       changed_by = VALUES(changed_by)
"""
PAUSED_QUEUES_SQL = f"SELECT queue FROM {QUEUE_TABLE} WHERE paused = 1"

REPLAY_SOURCE_SQL = f"""
SELECT message_id, queue, task_name, priority, payload FROM {ATTEMPT_TABLE} WHERE id = %s
"""


@dataclasses.dataclass(frozen=True)
class Operator:
    """Who asked for an operator action; written into the history row's ``actor``."""

    name: str
    host: str = ""
    pid: int | None = None


@dataclasses.dataclass(frozen=True)
class Stuck:
    """A claimed message that looks stuck, and whether releasing it is safe."""

    id: int
    reason: str
    #: False when its worker is alive (only overrunning): releasing would run it twice.
    releasable: bool


Gates = dict[subjects.GateRef, subjects.GateRow]
#: An action's change: given the locked messages and their locked gates, change the rows;
#: return the blocked messages it promoted, as (id, queue).
Change = Callable[[Any, list[subjects.Target], Gates], list[tuple[int, str]]]


def _gates_of(alias: str, ids: Sequence[int]) -> set[subjects.GateRef]:
    refs: set[subjects.GateRef] = set()
    with connection_for(alias).cursor() as cursor:
        for start in range(0, len(ids), OPERATOR_CHUNK):
            chunk = list(ids[start:start + OPERATOR_CHUNK])
            cursor.execute(GATES_OF_SQL.format(ids=placeholders(len(chunk))), chunk)
            refs.update(ref for queue, key, mode in cursor.fetchall()
                        if (ref := subjects.GateRef.of(str(queue), mode, key)) is not None)
    return refs


def _lock_and_record(cursor: Any, ids: Sequence[int], refs: set[subjects.GateRef],
                     operator: Operator, outcome: str, note: str, keep_payload: bool,
                     statuses: Sequence[str]) -> tuple[list[subjects.Target], Gates]:
    """In the caller's transaction: lock the gates ``refs``, then the rows among ``ids``
    in ``statuses`` (``OPERATOR_CHUNK`` a statement), and record ``outcome`` for each."""
    gates = subjects.lock_or_create(cursor, refs, {}) if refs else {}
    locked: list[subjects.Target] = []
    for start in range(0, len(ids), OPERATOR_CHUNK):
        chunk = list(ids[start:start + OPERATOR_CHUNK])
        cursor.execute(_LOCK_OPERABLE_SQL.format(ids=placeholders(len(chunk)),
                                                 statuses=placeholders(len(statuses))),
                       [*chunk, *statuses])
        locked.extend(subjects.Target(int(row[0]), str(row[1]), str(row[2]),
                                      subjects.GateRef.of(str(row[1]), row[4], row[3]), row[4])
                      for row in cursor.fetchall())
    for start in range(0, len(locked), OPERATOR_CHUNK):
        part = [target.id for target in locked[start:start + OPERATOR_CHUNK]]
        cursor.execute(OPERATOR_HISTORY_SQL.format(ids=placeholders(len(part))),
                       [outcome, operator.host[:255], operator.pid, note, keep_payload,
                        operator.name[:200], *part])
    if any(target.gate is not None and target.gate not in gates for target in locked):
        raise DatabaseError("A message's gate changed while it was being locked.")
    return locked, gates


def _operate(ids: Sequence[int], operator: Operator, outcome: str, note: str,
             change: Change, *, keep_payload: bool = False,
             statuses: Sequence[str] = OPERABLE_STATUSES) -> list[int]:
    """Lock the operable rows among ``ids`` (their gates first), record ``outcome`` for
    each, apply ``change``: one transaction per ``OPERATOR_CHUNK`` ids.

    Returns the ids changed; the others were gone, running or in another status.
    """
    alias = default_alias()
    done: list[int] = []
    queues: list[str] = []  # one entry per message changed: wake() wakes as many
    promoted: list[tuple[int, str]] = []
    unique = sorted({int(i) for i in ids})
    for start in range(0, len(unique), OPERATOR_CHUNK):
        chunk = unique[start:start + OPERATOR_CHUNK]
        refs = _gates_of(alias, chunk)

        def body(cursor: Any, chunk: list[int] = chunk,
                 refs: set[subjects.GateRef] = refs) -> list[subjects.Target]:
            locked, gates = _lock_and_record(cursor, chunk, refs, operator, outcome, note,
                                             keep_payload, statuses)
            if locked:
                promoted.extend(change(cursor, locked, gates))
            return locked

        for target in in_transaction(alias, body):
            done.append(target.id)
            queues.append(target.queue)
    subjects.wake_promoted(alias, promoted)
    if queues and outcome == Outcome.REQUEUED:
        try:
            wake(queues, alias)
        except DatabaseError as exc:
            logger.warning("Could not wake idle workers after a requeue (%s).", exc)
    return done


def requeue(ids: Sequence[int], operator: Operator, *, reset_attempts: bool = False,
            statuses: Sequence[str] = OPERABLE_STATUSES) -> list[int]:
    """Make ready, scheduled or dead messages ready now; return the ids requeued.

    Without ``reset_attempts`` a dead message gets one more attempt: its ``max_attempts``
    rises to its attempts + 1, so it reads "3/3" after that attempt, not "3/2". With
    ``reset_attempts`` its attempts go back to 0: a full set of ``max_attempts``.
    ``statuses`` narrows which messages qualify (``("dead",)`` to retry dead ones only).
    """
    if not set(statuses) <= set(OPERABLE_STATUSES):
        raise ValueError(f"Only ready, scheduled or dead messages can be requeued, not "
                         f"{sorted(set(statuses) - set(OPERABLE_STATUSES))}.")
    note = "requeued" + (" with attempts reset" if reset_attempts else "")

    def change(cursor: Any, locked: list[subjects.Target], gates: Gates
               ) -> list[tuple[int, str]]:
        cursor.execute(REQUEUE_SQL.format(ids=placeholders(len(locked))),
                       [reset_attempts, reset_attempts, *(target.id for target in locked)])
        subjects.after_requeue(cursor, locked, gates)
        return []

    return _operate(ids, operator, Outcome.REQUEUED, note, change, statuses=statuses)


def cancel(ids: Sequence[int], operator: Operator, *, note: str = "cancelled",
           statuses: Sequence[str] = CANCELLABLE_STATUSES) -> list[int]:
    """Delete ready, scheduled, blocked, throttled or dead messages, keeping their payload in
    history.

    ``note`` is the history row's message; ``statuses`` narrows which messages qualify
    (retention deletes only dead ones). A cancelled head of an ordered subject (or a
    slot holder of a concurrency key) frees its slot for the next blocked message.
    """
    if not set(statuses) <= set(CANCELLABLE_STATUSES):
        raise ValueError(f"Only ready, scheduled, blocked, throttled or dead messages can be "
                         "cancelled, "
                         f"not {sorted(set(statuses) - set(CANCELLABLE_STATUSES))}.")

    return _operate(ids, operator, Outcome.CANCELLED, note, _cancel_locked,
                    keep_payload=True, statuses=statuses)


def _cancel_locked(cursor: Any, locked: list[subjects.Target], gates: Gates
                   ) -> list[tuple[int, str]]:
    for start in range(0, len(locked), OPERATOR_CHUNK):
        part = [target.id for target in locked[start:start + OPERATOR_CHUNK]]
        cursor.execute(CANCEL_SQL.format(ids=placeholders(len(part))), part)
    return subjects.after_cancel(cursor, locked, gates)


def cancel_within(cursor: Any, alias: str, ids: Sequence[int], operator: Operator, *,
                  note: str, statuses: Sequence[str]) -> tuple[list[int], list[tuple[int, str]]]:
    """:func:`cancel` inside the caller's transaction on ``alias`` (``cursor`` is its), all
    of ``ids`` at once: no other session sees any of them claimable or promoted before
    the caller commits, and a gate's slot freed by one of them promotes none that is
    itself cancelled here. Returns the ids cancelled and the messages promoted (pass them
    to ``subjects.wake_promoted`` once committed)."""
    unique = sorted({int(i) for i in ids})
    if not unique:
        return [], []
    refs = _gates_of(alias, unique)
    locked, gates = _lock_and_record(cursor, unique, refs, operator, Outcome.CANCELLED, note,
                                     True, statuses)
    return [target.id for target in locked], _cancel_locked(cursor, locked, gates)


def set_priority(ids: Sequence[int], priority: int, operator: Operator) -> list[int]:
    """Change the priority of waiting or dead messages (history keeps the old one)."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ValueError(f"priority must be an integer from -100 to 100, not {priority!r}.")

    def change(cursor: Any, locked: list[subjects.Target], gates: Gates
               ) -> list[tuple[int, str]]:
        cursor.execute(PRIORITY_SQL.format(ids=placeholders(len(locked))),
                       [priority, *(target.id for target in locked)])
        return []

    return _operate(ids, operator, Outcome.PRIORITY, f"priority set to {priority}", change,
                    statuses=CANCELLABLE_STATUSES)


def stuck_messages(liveness: str | None = None) -> list[Stuck]:
    """Claimed messages whose owner is gone, whose lease ran out, or past their timeout."""
    session = connection_session()
    liveness = session.liveness(liveness or get_settings().LIVENESS)
    server_start = session.server_start
    with connection_for().cursor() as cursor:
        cursor.execute(STUCK_CANDIDATES_SQL)
        rows = cursor.fetchall()
        if not rows:
            return []
        live = live_connections(cursor, liveness)
    stuck = []
    for message_id, _token, owner, owner_start, expired, overran in rows:
        reason = loss_reason(owner, owner_start, bool(expired), live, liveness, server_start)
        if reason is not None:
            stuck.append(Stuck(int(message_id), reason, True))
        elif overran:
            stuck.append(Stuck(int(message_id), "running past its timeout (worker alive)",
                               False))
    return stuck


def release_stuck(ids: Sequence[int], operator: Operator) -> dict[int, str]:
    """Give stuck claims back to the queue; return ``{id: reason}`` of those released.

    A claim is released only if recovery would take it too (owner connection gone, server
    restarted, or lease expired), judged again under the row lock. A message whose worker
    is alive is refused even if it overran: the worker is still running it.
    """
    alias = default_alias()
    require_autocommit(alias, "release_stuck()")
    session = connection_session(alias)
    liveness = session.liveness(get_settings().LIVENESS)
    server_start = session.server_start
    released: dict[int, str] = {}
    for message_id in sorted({int(i) for i in ids}):
        refs = _gates_of(alias, [message_id])
        promoted: list[tuple[int, str]] = []

        def body(cursor: Any, message_id: int = message_id,
                 refs: set[subjects.GateRef] = refs,
                 promoted: list[tuple[int, str]] = promoted) -> str | None:
            gates = subjects.lock_or_create(cursor, refs, {}) if refs else {}
            cursor.execute(_LOCK_CLAIMED_SQL, [message_id])
            row = cursor.fetchone()
            if row is None:
                return None
            token, owner, owner_start, expired, gate_mode = row
            live = live_connections(cursor, liveness)
            reason = loss_reason(owner, owner_start, bool(expired), live, liveness,
                                  server_start)
            if reason is None:
                return None
            cursor.execute(LOCKED_FATE_SQL, [message_id, token])
            started, last_attempt = (bool(value) for value in cursor.fetchone())
            out_of_attempts = started and last_attempt
            outcome = Outcome.FAILED if out_of_attempts else Outcome.RELEASED
            note = f"claim released by an operator: {reason}"
            if not started:
                note = f"{note}; {NOT_STARTED}"
            cursor.execute(OPERATOR_HISTORY_SQL.format(ids="%s"),
                           [outcome, operator.host[:255], operator.pid, note, out_of_attempts,
                            operator.name[:200], message_id])
            cursor.execute(RECOVER_SQL, [f"WorkerLost: {reason}", message_id, token])
            if out_of_attempts and gates and subjects.frees_when_dead(gate_mode):
                promoted[:] = subjects.release(cursor, dict.fromkeys(gates, 1), gates)
            return reason

        reason = in_transaction(alias, body)
        subjects.wake_promoted(alias, promoted)
        if reason is not None:
            released[message_id] = reason
    return released


#: A task's attempts, backoff and timeout, as a replayed copy gets them.
TaskLimits = tuple[int, float, float | None]


#: A replayed copy's rate-limit key, spacing (microseconds) and limit as declared.
RateOfCopy = tuple[str, int, str]


def replay(attempt_id: int, operator: Operator, limits: TaskLimits | None = None,
           rate: RateOfCopy | None = None) -> int:
    """Enqueue a copy of the message a history row finished; return the new message's id.

    Only final rows keep the payload (succeeded, failed, cancelled). ``limits`` are the
    task's current attempts, backoff and timeout (:func:`django_mysqlq.ops.replay` looks
    them up); without them the settings' defaults apply. ``rate``: the copy's rate-limit
    key, so that it waits for the task's limit like any message of it.

    The row is read on this thread's alias (``routing.on_alias``, else
    ``MYSQLQ['DATABASE']``); the copy, and the ``replayed`` history row beside it, go to
    the queue's own database, which is another one if the queue moved since.
    """
    alias = default_alias()
    with connection_for(alias).cursor() as cursor:
        cursor.execute(REPLAY_SOURCE_SQL, [attempt_id])
        row = cursor.fetchone()
    if row is None:
        raise LookupError(f"History row {attempt_id} does not exist (purged?).")
    message_id, queue, task_name, priority, payload = row
    if not payload:
        raise ValueError(
            f"History row {attempt_id} keeps no arguments: only the final row of a message "
            "(succeeded, failed or cancelled) can be replayed; pick that one.")
    if limits is None:
        conf = get_settings()
        limits = (conf.MAX_ATTEMPTS, conf.RETRY_BACKOFF, None)
    max_attempts, backoff, timeout = limits
    message = NewMessage(task_name=task_name, queue=queue, priority=int(priority),
                         payload=payload, run_at=None, delay=0.0, max_attempts=max_attempts,
                         retry_backoff=backoff, timeout=timeout, dedup_key=None,
                         rate_key=rate[0] if rate else None,
                         rate_interval=rate[1] if rate else None,
                         rate_limit=rate[2] if rate else "")
    target = alias_for_queue(queue)
    # Linked like the pipeline's copies ("replayed from #N", ``replayed_from``), so its
    # replay skips this original. A copy on another database (the queue moved) is not
    # linked: the original's id means another message there.
    same = target == alias
    note = f"replayed from #{message_id}" + ("" if same else f" on database {alias}") \
        + f" (history row {attempt_id})"
    with transaction.atomic(using=target):
        [new_id] = enqueue([message])
        with connection_for(target).cursor() as cursor:
            cursor.execute(
                REPLAYED_HISTORY_SQL,
                [Outcome.REPLAYED, operator.host[:255], operator.pid, note,
                 operator.name[:200], int(message_id) if same else None, new_id])
    return new_id


def set_paused(queue: str, paused: bool, operator: Operator) -> None:
    """Pause or resume a queue.

    Busy workers re-read the paused set about every second; parked ones re-read it before
    their next claim, and are woken here so that happens now. On the queue's own database.
    """
    alias = alias_for_queue(queue)
    with connection_for(alias).cursor() as cursor:
        cursor.execute(SET_PAUSED_SQL, [queue, paused, operator.name[:200]])

    def wake_parked() -> None:
        try:
            wake([queue], alias, everyone=True)  # every parked worker must re-read the paused set
        except DatabaseError as exc:
            logger.warning("Could not wake idle workers after %s %s (%s).",
                           "pausing" if paused else "resuming", queue, exc)

    # After the commit: a worker woken earlier would read the old state and park again.
    transaction.on_commit(wake_parked, using=alias)


def paused_queues(alias: str | None = None) -> set[str]:
    """Names of the queues an operator paused."""
    with connection_for(alias).cursor() as cursor:
        cursor.execute(PAUSED_QUEUES_SQL)
        return {str(row[0]) for row in cursor.fetchall()}


