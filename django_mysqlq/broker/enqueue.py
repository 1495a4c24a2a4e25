"""Enqueue: insert messages in the caller's transaction, then wake parked workers.

A message with an ordered subject or a concurrency key first counts itself into its gate
(``subjects.acquire``, gates in sorted order), which says whether it gets a slot (ready or
scheduled) or waits ``blocked``; both statements are in the same transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, OperationalError, transaction

from ..messages import NewMessage
from ..models import MessageStatus
from ..routing import alias_for_queue
from ..signals import message_enqueued
from .base import (
    DEADLOCK,
    MESSAGE_TABLE,
    all_or_none,
    connection_for,
    error_code,
    in_transaction,
    logger,
    micros,
    naive_utc,
    send_robust,
)
from .dedup_lock import one_inserter
from .literals import execute_escaped
from .packets import escaped_size, refuse_past_packet, split_by_size, statement_room
from .park import wake
from .rates import ensure_keys
from .subjects import GateRef, acquire
from .unique import take_key

#: Rows per multi-row INSERT in enqueue_many (bytes per statement: see packets.py).
INSERT_CHUNK = 1000
#: Bytes of a row besides its payload and names: the row's template, numbers and times.
INSERT_ROW_BYTES = 400

_INSERT_COLUMNS = (
    "queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, dedup_key, "
    "enqueued_at, run_at, status, attempts, last_error"
)
#: One row of the enqueue INSERT. run_at is the absolute time given, else now + delay, both
#: on the database clock; the row is scheduled when that lies in the future.
_INSERT_ROW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), "
    "COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND), "
    "IF(COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND) > UTC_TIMESTAMP(6), "
    "'scheduled', 'ready'), 0, '')"
)
#: The same row for a message that is ready at once (no run_at, no delay): fewer
#: parameters to escape, which is most of a bulk enqueue's client-side cost.
_INSERT_ROW_NOW = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'ready', 0, '')"
)
#: ... and without a dedup key (every row of an enqueue_many()).
_INSERT_ROW_NOW_NO_KEY = (
    "(%s, %s, %s, %s, %s, %s, %s, NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'ready', 0, '')"
)
#: The enqueue INSERT of one or more ``{rows}`` (``_INSERT_ROW…`` templates, comma-joined).
INSERT_SQL = f"INSERT INTO {MESSAGE_TABLE} ({_INSERT_COLUMNS}) VALUES {{rows}}"

_GATED_COLUMNS = (
    "queue, task_name, payload, priority, max_attempts, retry_backoff, timeout, dedup_key, "
    "gate_key, gate_mode, gate_limit, enqueued_at, run_at, status, attempts, last_error"
)
#: One row of a message that may pass a gate: the status its gate gave it ('blocked', or
#: 'scheduled' for a concurrency-limited message that takes its slot when due) or NULL for
#: one holding a slot, which is ready or scheduled by its run_at as usual.
_INSERT_ROW_GATED = (
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6), "
    "COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND), "
    "COALESCE(%s, IF(COALESCE(%s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND) "
    "> UTC_TIMESTAMP(6), 'scheduled', 'ready')), 0, '')"
)
#: The INSERT of rows of which some pass a gate (``_INSERT_ROW_GATED``, comma-joined).
GATED_INSERT_SQL = f"INSERT INTO {MESSAGE_TABLE} ({_GATED_COLUMNS}) VALUES {{rows}}"
#: The same, reading the new ids back (MariaDB only: MySQL has no INSERT … RETURNING).
INSERT_RETURNING_SQL = INSERT_SQL + " RETURNING id"
GATED_INSERT_RETURNING_SQL = GATED_INSERT_SQL + " RETURNING id"
#: The pending message that holds a dedup key (the unique key refused ours), with the
#: session's isolation level (``{level}``: the variable's name differs by server), in one
#: round trip: under READ COMMITTED this read is of the latest committed rows.
DEDUP_HOLDER_SQL = (f"SELECT {{level}}, (SELECT id FROM {MESSAGE_TABLE} WHERE dedup_key = %s)")
#: The holder as a locking read: the latest committed row, whatever the caller's snapshot.
#: Under REPEATABLE READ the plain read sees the snapshot, which may predate the holder's
#: commit (no holder), or still show a message that finished since, its key then taken by
#: a new one (a wrong, finished holder). It holds a share lock on the holder until the
#: caller's transaction ends: a worker's claim or ack of that message waits for it (the
#: claim not at all on MariaDB, at most ``locked.LOCK_WAIT_SECONDS`` on MySQL: it steps
#: around it).
DEDUP_HOLDER_LOCKING_SQL = (f"SELECT id FROM {MESSAGE_TABLE} WHERE dedup_key = %s "
                            "LOCK IN SHARE MODE")
#: Levels whose plain reads see the latest commit (MariaDB and MySQL spell them alike).
_FRESH_READS = frozenset({"READ-COMMITTED", "READ-UNCOMMITTED"})



def _ready_now(message: NewMessage) -> bool:
    return message.run_at is None and not message.delay


def _row(message: NewMessage) -> tuple[str, list[Any]]:
    """The VALUES row template for this message and its parameters."""
    params = [
        message.queue, message.task_name, message.payload, message.priority,
        message.max_attempts, message.retry_backoff, message.timeout,
    ]
    if _ready_now(message):
        if message.dedup_key is None:
            return _INSERT_ROW_NOW_NO_KEY, params
        return _INSERT_ROW_NOW, [*params, message.dedup_key]
    params.append(message.dedup_key)
    run_at = naive_utc(message.run_at) if message.run_at is not None else None
    delay_micros = micros(message.delay)
    return _INSERT_ROW, [*params, run_at, delay_micros, run_at, delay_micros]


def _gated_row(message: NewMessage, status: str | None) -> tuple[str, list[Any]]:
    """The gated VALUES row and its parameters (``status``: see ``_INSERT_ROW_GATED``)."""
    run_at = naive_utc(message.run_at) if message.run_at is not None else None
    delay_micros = micros(message.delay)
    return _INSERT_ROW_GATED, [
        message.queue, message.task_name, message.payload, message.priority,
        message.max_attempts, message.retry_backoff, message.timeout, message.dedup_key,
        message.gate_key, message.gate_mode, message.gate_limit,
        run_at, delay_micros, status, run_at, delay_micros,
    ]


#: Status of a message that passes no gate, or holds a slot of its gate: by its run_at.
_BY_RUN_AT = None
Statuses = Sequence[str | None] | None


def _row_for(message: NewMessage, statuses: Statuses, index: int) -> tuple[str, list[Any]]:
    if statuses is None:
        return _row(message)
    return _gated_row(message, statuses[index])


def extra_columns(messages: Sequence[NewMessage]) -> list[str]:
    """Columns beyond the templates' that these messages need: ``unique_for``, and a rate
    limit's key and spacing (left to their defaults otherwise: nothing more to send)."""
    columns = ["unique_for"] if any(m.unique_for for m in messages) else []
    if any(m.rate_key is not None for m in messages):
        columns += ["rate_key", "rate_interval"]
    return columns


def with_extras(sql: str, columns: Sequence[str]) -> str:
    """The INSERT ``sql`` writing ``columns`` too (see :func:`extra_columns`)."""
    if not columns:
        return sql
    return sql.replace("last_error)", f"last_error, {', '.join(columns)})", 1)


def _extended_row(message: NewMessage, row: str, params: list[Any], columns: Sequence[str]
                  ) -> tuple[str, list[Any]]:
    """A row writing ``columns`` too. A rate-limited message due now is 'throttled', not
    'ready': only a rate-limited claim takes it (``rates``)."""
    if not columns:
        return row, params
    if message.rate_key is not None:
        row = row.replace("'ready'", "'throttled'")
    values = {"unique_for": message.unique_for, "rate_key": message.rate_key,
              "rate_interval": message.rate_interval}
    return row[:-1] + ", %s" * len(columns) + ")", [*params, *(values[c] for c in columns)]


def _insert_one(alias: str, message: NewMessage, statuses: Statuses = None) -> int:
    row, params = _row_for(message, statuses, 0)
    columns = extra_columns([message])
    sql = with_extras(INSERT_SQL if statuses is None else GATED_INSERT_SQL, columns)
    row, params = _extended_row(message, row, params, columns)
    with connection_for(alias).cursor() as cursor:
        cursor.execute(sql.format(rows=row), params)
        return int(cursor.lastrowid)


def _insert_many(alias: str, messages: Sequence[NewMessage], statuses: Statuses = None,
                 sizes: Sequence[int] | None = None, whole: bool = False) -> list[int]:
    """Insert in as few statements as fit. ``whole``: the caller has no transaction of
    the broker's open (Django may not know of one: the explicit ones of ``in_transaction``),
    so several statements go in one transaction of their own unless the user's
    (:func:`all_or_none`)."""
    connection = connection_for(alias)
    if not connection.mysql_is_mariadb:  # type: ignore[attr-defined]
        # MySQL has no INSERT … RETURNING: insert one by one to learn every id.
        return all_or_none(alias, len(messages) if whole else 1, lambda: [
            _insert_one(alias, message, None if statuses is None else [statuses[i]])
            for i, message in enumerate(messages)])
    columns = extra_columns(messages)
    sql = with_extras(INSERT_RETURNING_SQL if statuses is None
                      else GATED_INSERT_RETURNING_SQL, columns)
    chunks = _chunks(list(range(len(messages))), messages, statement_room(alias), sizes)

    def insert() -> list[int]:
        ids: list[int] = []
        with connection.cursor() as cursor:
            for chunk in chunks:
                params: list[Any] = []
                rows: list[str] = []
                for index in chunk:
                    row, row_params = _extended_row(
                        messages[index], *_row_for(messages[index], statuses, index), columns)
                    rows.append(row)
                    params.extend(row_params)
                execute_escaped(cursor, sql.format(rows=", ".join(rows)), params)
                ids.extend(int(row[0]) for row in cursor.fetchall())
        return ids

    return all_or_none(alias, len(chunks) if whole else 1, insert)


def sent_size(message: NewMessage) -> int:
    """Bytes the message's row takes in an INSERT as sent, at most."""
    return (escaped_size(message.payload) + INSERT_ROW_BYTES
            + 4 * (len(message.queue) + len(message.task_name) + len(message.dedup_key or "")
                   + len(message.gate_key or "")))


def _chunks(indexes: Sequence[int], messages: Sequence[NewMessage], room: int,
            sizes: Sequence[int] | None = None) -> list[Sequence[int]]:
    """Split into INSERTs of at most INSERT_CHUNK rows and ``room`` bytes as sent."""
    if sizes is None:
        sizes = [sent_size(m) for m in messages]
    return split_by_size(indexes, sizes, room, INSERT_CHUNK)


def _check_packet(alias: str, messages: Sequence[NewMessage]) -> None:
    """Refuse a message whose row alone would pass the server's ``max_allowed_packet``
    (only a site that raised ``MAX_PAYLOAD_BYTES`` near it can make one): the server would
    refuse the INSERT and close the connection, the caller's transaction with it."""
    refuse_past_packet([sent_size(message) for message in messages], alias,
                       lambda index: f"The arguments of task {messages[index].task_name!r} take",
                       room_for="one row", send="pass")


def gate_statuses(cursor: Any, messages: Sequence[NewMessage]) -> list[str | None]:
    """Count the messages that pass a gate into it, gates in sorted order (producers of
    several gates then never deadlock on each other); return each message's status:
    None (it holds a slot), 'blocked', or 'scheduled' for a delayed concurrency-limited
    message, which takes its slot only when due (see ``promote``)."""
    statuses: list[str | None] = [_BY_RUN_AT] * len(messages)
    by_gate: dict[GateRef, list[int]] = {}
    for index, message in enumerate(messages):
        ref = GateRef.of(message.queue, message.gate_mode, message.gate_key)
        if ref is None:
            continue
        if not ref.ordered and not _ready_now(message):
            statuses[index] = MessageStatus.SCHEDULED
            continue
        by_gate.setdefault(ref, []).append(index)
    for ref in sorted(by_gate):
        indexes = by_gate[ref]
        slots = 1 if ref.ordered else int(messages[indexes[-1]].gate_limit or 1)
        taken = acquire(cursor, ref, slots, len(indexes))
        for index in indexes[taken:]:
            statuses[index] = MessageStatus.BLOCKED
    return statuses


def insert_rows(alias: str, messages: Sequence[NewMessage], statuses: Statuses = None,
                sizes: Sequence[int] | None = None) -> list[int]:
    """Insert in the transaction already open on ``alias`` (``statuses`` from
    :func:`gate_statuses`, or None when no message passes a gate); return the ids.
    ``sizes``: each row's :func:`sent_size`, where the caller has measured them."""
    if len(messages) == 1:
        return [_insert_one(alias, messages[0], statuses)]
    return _insert_many(alias, messages, statuses, sizes)


def _insert_gated(alias: str, messages: Sequence[NewMessage]) -> tuple[list[int], list[str]]:
    """Gates, then rows, in one transaction; the ids, and the queues to wake (one entry per
    message that holds a slot: a blocked one needs no worker yet)."""
    def body(cursor: Any) -> tuple[list[int], list[str]]:
        statuses = gate_statuses(cursor, messages)
        ids = ([_insert_one(alias, messages[0], statuses)] if len(messages) == 1
               else _insert_many(alias, messages, statuses))
        return ids, [m.queue for m, status in zip(messages, statuses, strict=True)
                     if status != MessageStatus.BLOCKED]

    return in_transaction(alias, body)


def _insert_keyed(alias: str, message: NewMessage) -> int:
    """The INSERT of a message with a dedup key, after its rate keys and its gate."""
    if message.rate_key is not None:
        with connection_for(alias).cursor() as cursor:
            ensure_keys(cursor, [message])
    if message.gate_key is None:
        return _insert_one(alias, message)
    with connection_for(alias).cursor() as cursor:
        statuses = gate_statuses(cursor, [message])
    return _insert_one(alias, message, statuses)


def _insert_deduplicated(alias: str, message: NewMessage) -> tuple[int, bool]:
    """Insert, or return the id of the message that already has this dedup key: a pending
    one, or (for an enqueue with ``unique_for``) one whose success keeps it taken.

    A dead message gives its key up, so only ready, scheduled, blocked or running ones
    block, and succeeded ones during their period.

    With ``unique_for``, the key's row is locked first and held until the transaction
    ends (the lock order in ``unique``): producers of the key insert one at a time, and
    one that finds a period inserts nothing.
    """
    if message.unique_for <= 0:
        return _insert_or_find(alias, message)
    connection = connection_for(alias)
    if connection.in_atomic_block or not connection.get_autocommit():
        return _take_key_then_insert(alias, message)
    with transaction.atomic(using=alias):  # the key's row is held until the commit
        return _take_key_then_insert(alias, message)


def _take_key_then_insert(alias: str, message: NewMessage) -> tuple[int, bool]:
    with connection_for(alias).cursor() as cursor:
        holder = take_key(cursor, message)
    if holder is not None:
        return holder, False
    return _insert_or_find(alias, message, serialized=True)


def _insert_or_find(alias: str, message: NewMessage, serialized: bool = False
                    ) -> tuple[int, bool]:
    """Insert, or return the pending message that holds the key (a duplicate). Producers
    of the key insert one at a time (``dedup_lock``) unless already ``serialized`` (the
    key's row of ``unique_for`` is held)."""
    assert message.dedup_key is not None
    # Our own transaction (autocommit before): a deadlock between producers of the key
    # (behind a proxy, where no named lock serializes them) rolled back only it: again.
    own = not connection_for(alias).in_atomic_block
    for attempt in range(3):
        try:
            # (A duplicate undoes its gate's count: the savepoint.)
            with transaction.atomic(using=alias), contextlib.ExitStack() as stack:
                if not serialized:
                    stack.enter_context(one_inserter(alias, message.dedup_key))
                return _insert_keyed(alias, message), True
        except OperationalError as exc:
            if not own or error_code(exc) != DEADLOCK or attempt == 2:
                raise
            continue
        except IntegrityError:
            holder = _dedup_holder(alias, message.dedup_key)
            if holder is not None:
                return holder, False
            if attempt == 2:
                raise
            # The holder finished between our insert and our look-up: insert again.
    raise AssertionError("unreachable")


def _dedup_holder(alias: str, key: str) -> int | None:
    """The id of the message that holds ``key`` now, or None (it finished meanwhile).

    The plain read, unless the session is at REPEATABLE READ (or SERIALIZABLE): then the
    locking read, since the snapshot may be older than the holder (``DEDUP_HOLDER_SQL``).
    """
    connection = connection_for(alias)
    level = "@@tx_isolation" if connection.mysql_is_mariadb else "@@transaction_isolation"  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(DEDUP_HOLDER_SQL.format(level=level), [key])
        isolation, holder = cursor.fetchone()
        if str(isolation).upper() not in _FRESH_READS:
            cursor.execute(DEDUP_HOLDER_LOCKING_SQL, [key])
            row = cursor.fetchone()
            holder = None if row is None else row[0]
    return None if holder is None else int(holder)


def _insert_rated(alias: str, cursor: Any, messages: Sequence[NewMessage]) -> list[int]:
    """Rate keys' rows, then the messages, in one transaction."""
    ensure_keys(cursor, messages)
    return ([_insert_one(alias, messages[0])] if len(messages) == 1
            else _insert_many(alias, messages))


def enqueue(messages: Sequence[NewMessage]) -> list[int]:
    """Insert messages in the caller's transaction (if any); return their ids in order.

    Each message goes to its queue's database (``routing.alias_for_queue``) and joins the
    caller's transaction on that alias. Times are taken from the database clock. A
    message whose ``run_at`` lies in the future is stored as scheduled and promoted to
    ready when it is due.
    """
    if not messages:
        return []
    if len(messages) > 1 and any(message.dedup_key is not None for message in messages):
        # Each key needs its own check (a unique task's calls): one by one, in the
        # caller's transaction, then one announcement for the call (per database).
        return _enqueue_one_by_one(messages)
    groups: dict[str, list[int]] = {}
    for index, message in enumerate(messages):
        groups.setdefault(alias_for_queue(message.queue), []).append(index)
    if len(groups) == 1:
        [alias] = groups
        return _enqueue_on(alias, messages)
    # Queues on several databases: one insert per database, each in its own transaction
    # (there is no transaction across two servers); the ids in the given order.
    ids: list[int] = [0] * len(messages)
    for alias, indexes in groups.items():
        for index, message_id in zip(indexes, _enqueue_on(alias, [messages[i] for i in indexes]),
                                     strict=True):
            ids[index] = message_id
    return ids


def _enqueue_one_by_one(messages: Sequence[NewMessage]) -> list[int]:
    ids: list[int] = []
    new: dict[str, tuple[list[int], list[str]]] = {}  # alias: (new ids, their queues)
    try:
        for message in messages:
            alias = alias_for_queue(message.queue)
            [message_id], new_ids, queues = _insert_on(alias, [message])
            ids.append(message_id)
            if new_ids:
                new.setdefault(alias, ([], []))[0].extend(new_ids)
                new[alias][1].extend(queues)
    finally:  # what is written is announced, even if a later message failed
        for alias, (new_ids, queues) in new.items():
            _announce(alias, messages[0].task_name, new_ids, queues)
    return ids


def _enqueue_on(alias: str, messages: Sequence[NewMessage]) -> list[int]:
    ids, new_ids, queues = _insert_on(alias, messages)
    if new_ids:
        _announce(alias, messages[0].task_name, new_ids, queues)
    return ids


def _announce(alias: str, task_name: str, new_ids: list[int], queues: list[str]) -> None:
    """Wake workers and send ``message_enqueued`` once the caller's transaction commits."""
    transaction.on_commit(lambda: _after_enqueue(task_name, new_ids, queues, alias),
                          using=alias)


def _insert_on(alias: str, messages: Sequence[NewMessage]
               ) -> tuple[list[int], list[int], list[str]]:
    """Insert on ``alias``: (the ids in order, those newly written, the queues to wake)."""
    _check_packet(alias, messages)
    queues = [message.queue for message in messages]  # one per message: wake() counts
    if len(messages) == 1 and messages[0].dedup_key is not None:
        message_id, inserted = _insert_deduplicated(alias, messages[0])
        ids = [message_id]
        new_ids = ids if inserted else []
    elif any(message.gate_key is not None for message in messages):
        ids, queues = _insert_gated(alias, messages)
        new_ids = ids
    elif any(message.rate_key is not None for message in messages):
        ids = new_ids = in_transaction(alias, lambda cursor: _insert_rated(alias, cursor,
                                                                           messages))
    elif len(messages) == 1:
        ids = new_ids = [_insert_one(alias, messages[0])]
    else:
        ids = new_ids = _insert_many(alias, messages, whole=True)
    return ids, new_ids, queues


def _after_enqueue(task_name: str, ids: list[int], queues: list[str], alias: str) -> None:
    try:
        wake(queues, alias)
    except DatabaseError as exc:  # the messages are committed; workers will poll them
        logger.warning("Could not wake idle workers after an enqueue (%s).", exc)
    send_robust(message_enqueued, task_name, message_ids=ids)

