"""Consumer groups: their rows, and the pump that turns topic messages into deliveries.

A delivery is an ordinary queue message (queue ``group:<group>``, task
``topic:<topic>:<group>``): claimed, acked, retried, dead and recovered like any other.
The pump takes the group's row lock (``SKIP LOCKED``: one member pumps at a time, the
others go on claiming), reads the sequenced messages after the group's position, inserts
them as deliveries with their ``mysqlq_topic_delivery`` links, and moves the position, all
in one transaction: each offset becomes a delivery of each group exactly once. A look
(one autocommit statement) comes first, so a round with nothing to do opens no
transaction; a group that has every sequenced message may stamp its topic's new ones
in that same transaction (``pump_group(sequence=True)``, see ``topics.py``).

The window bounds what waits in the queue table, not running: the look counts the
group's ready and scheduled deliveries up to the window (its retries count only while its
handler fails: ``group_window``), and its blocked ones up to ``BLOCKED_WINDOWS``
windows (a held or hot key); the pump waits at either bound, and the backlog stays in the
topic.

A member with room to run more (``pump_claiming``) pumps, when no delivery of the group
is ready, only what it takes itself and inserts those deliveries already claimed by it (its
token, connection and lease, attempt 1): the same row a claim would leave, without the
claim's ``UPDATE`` (which moves each row in six indexes and steps over the delete-marked
entries of the rows claimed before it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from ..messages import ClaimedMessage, NewMessage
from ..models import MessageStatus
from ..signals import topic_pumped
from ..topicnames import EARLIEST
from .base import (
    connection_for,
    default_alias,
    in_transaction,
    logger,
    send_robust,
)
from .delivery_insert import PumpClaim, insert_deliveries
from .enqueue import gate_statuses
from .group_window import (
    AT_BOUND_SQL,
    BLOCKED,
    BLOCKED_WINDOWS,
    NONE_READY,
    PENDING,
    SCHEDULED,
    retries_hold,
    weighed_from,
)
from .kept import kept_bounds
from .literals import execute_escaped
from .oversized import PUMP_READ_SQL, Oversized, fitting
from .packets import row_room
from .park import wake
from .pumped import Pumped
from .topics import (
    OFFSET_INDEX,
    SEQUENCE_BATCH,
    TOPIC_MESSAGE_TABLE,
    TOPIC_TABLE,
    sequence_round,
)
from .topictables import GROUP_TABLE as GROUP_TABLE

DELIVERY_TABLE = "mysqlq_topic_delivery"
#: Create a group where it has no row yet, at its start: latest starts after the last
#: offset given out, earliest before the first one kept (the parameter:
#: ``kept.kept_bounds``, never past the last offset). Links of an older group of that name
#: (its row deleted by hand, as an abandoned group's was) are not read: a group
#: subscribed again starts where its ``start`` says.
CREATE_GROUP_SQL = (
    f"INSERT IGNORE INTO {GROUP_TABLE} (topic, group_name, queue, start, position, "
    f"created_at, changed_by) SELECT %s, %s, %s, %s, COALESCE((SELECT IF(%s = 'earliest', "
    f"%s, last_offset) FROM {TOPIC_TABLE} WHERE name = %s), 0), UTC_TIMESTAMP(6), ''"
)
#: Make the row again of a group whose row was deleted while its members ran (a member's
#: pump found none: ``_missing``): it goes on after the last of its deliveries (their
#: links are kept), or at its start if it had none.
RESUME_GROUP_SQL = (
    f"INSERT IGNORE INTO {GROUP_TABLE} (topic, group_name, queue, start, position, "
    f"created_at, changed_by) SELECT %s, %s, %s, %s, COALESCE((SELECT MAX(msg_offset) FROM "
    f"{DELIVERY_TABLE} WHERE topic = %s AND group_name = %s), (SELECT IF(%s = 'earliest', "
    f"%s, last_offset) FROM {TOPIC_TABLE} WHERE name = %s), 0), "
    "UTC_TIMESTAMP(6), ''"
)
#: Whether the group has its row (a plain read: never waits for a lock on it).
GROUP_EXISTS_SQL = f"SELECT 1 FROM {GROUP_TABLE} WHERE topic = %s AND group_name = %s"
#: The pump's lock: one member at a time; the others skip it.
LOCK_GROUP_SQL = (f"SELECT id, position FROM {GROUP_TABLE} WHERE topic = %s AND group_name = %s"
                  " FOR UPDATE SKIP LOCKED")
#: A woken member's pump takes the lock only while no delivery of the group is ready and
#: its window has room: its scheduled ones under half the window (more are the look's to
#: weigh: ``group_window``), its blocked ones under their bound (the subqueries are plain
#: reads: they lock no message). Ready ones are claimed first, and a full window is the
#: look's to say (the pump then looks as usual). It returns the scheduled ones too: the
#: pump takes no more than the window's room, as the look's does (in the same statement:
#: none more between a publish and its handler), counted once (a one-row derived table,
#: a plain read). A group past its topic's last offset is the look's (``group_ahead``):
#: this pump would read on after its position, past the offsets its round stamps.
LOCK_GROUP_IF_ROOM_SQL = (
    f"SELECT id, position, scheduled FROM {GROUP_TABLE} JOIN (SELECT {SCHEDULED} AS"
    f" scheduled) AS room WHERE topic = %s AND group_name = %s AND position <= (SELECT"
    f" last_offset FROM {TOPIC_TABLE} WHERE name = %s) AND {NONE_READY} AND"
    f" scheduled < %s AND {BLOCKED} < %s FOR UPDATE SKIP LOCKED")
#: The pump's look before its transaction (autocommit, no lock): whether the group is
#: behind its topic's last offset, its deliveries ready or scheduled (retries) counted up
#: to the window, and (only when it is not behind: the look walks the offset index's NULL
#: end, slow while purge lags behind the stamping) whether committed messages lack an
#: offset. Most looks of a busy member end here, one statement instead of a transaction.
#: Then whether the group's row carries a note of a pump problem (``topic_problems``),
#: whether none of its deliveries is ready, its blocked ones counted up to their bound
#: (``BLOCKED_WINDOWS`` windows), and its retries up to the window (whether they count
#: in it: ``group_window``).
LOOK_SQL = (
    f"SELECT g.position < t.last_offset, {PENDING},"
    f" g.position >= t.last_offset AND EXISTS(SELECT 1 FROM {TOPIC_MESSAGE_TABLE}"
    f" FORCE INDEX ({OFFSET_INDEX}) WHERE topic = g.topic AND msg_offset IS NULL),"
    f" g.position, t.last_offset, g.pump_problem <> '', {NONE_READY}, {BLOCKED},"
    f" {SCHEDULED}"
    f" FROM {GROUP_TABLE} g JOIN {TOPIC_TABLE} t ON t.name = g.topic"
    " WHERE g.topic = %s AND g.group_name = %s"
)
#: Whether a group has anything to pump (``--burst``): a message after its position up to
#: the topic's last offset (not just a last offset past its position: those messages may
#: be gone), or messages without an offset (its pump stamps them).
BEHIND_SQL = (
    f"SELECT EXISTS(SELECT 1 FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX})"
    " WHERE topic = g.topic AND msg_offset > g.position AND msg_offset <= t.last_offset),"
    f" EXISTS(SELECT 1 FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX ({OFFSET_INDEX})"
    " WHERE topic = g.topic AND msg_offset IS NULL)"
    f" FROM {GROUP_TABLE} g JOIN {TOPIC_TABLE} t ON t.name = g.topic"
    " WHERE g.topic = %s AND g.group_name = %s"
)
#: The next sequenced messages after the group's position.
_LINK_ROW = "(%s, %s, %s, %s, UTC_TIMESTAMP(6))"
LINK_SQL = (f"INSERT INTO {DELIVERY_TABLE} (message_id, topic, group_name, msg_offset, "
            "created_at) VALUES {rows}")
#: (A pump that moves the position ends whatever problem its group had: ``topic_problems``.)
MOVE_SQL = (f"UPDATE {GROUP_TABLE} SET position = %s, pumped_at = UTC_TIMESTAMP(6), "
            "pump_problem = '', pump_problem_at = NULL WHERE id = %s")
#: What :func:`_pump` made when its group's row was held (not woken: see LOCK_GROUP_SQL).
HELD = -2
#: A group's position (None: no such group).
POSITION_SQL = f"SELECT position FROM {GROUP_TABLE} WHERE topic = %s AND group_name = %s"


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """What the pump needs of a group subscription."""

    topic: str
    group: str
    queue: str
    task_name: str
    #: ``hold`` or ``skip``: the gate mode of keyed deliveries.
    on_dead: str
    max_attempts: int
    retry_backoff: float
    timeout: float | None
    start: str = "latest"


def create_group(spec: GroupSpec, alias: str | None = None, *, resume: bool = False) -> bool:
    """Give the group a row (and its position) unless it has one; return whether it made
    one. A row that exists is only read (``INSERT IGNORE`` would wait for a lock a
    stranger holds on it: a worker's start must not).

    The position is the group's start; with ``resume`` (a running member whose group's
    row was deleted under it), after the group's last delivery if it has one. Without it
    the links of an older group of that name are not read: they were a retired group's,
    and a group subscribed again under its name took them over (``latest`` handled every
    kept message since that group's last delivery, ``earliest`` skipped those before)."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(GROUP_EXISTS_SQL, [spec.topic, spec.group])
        if cursor.fetchone() is not None:
            return False
        bounds = kept_bounds(cursor, spec.topic) if spec.start == EARLIEST else None
        earliest = bounds[0] - 1 if bounds is not None else 0
        if resume:
            cursor.execute(RESUME_GROUP_SQL, [spec.topic, spec.group, spec.queue, spec.start,
                                              spec.topic, spec.group, spec.start, earliest,
                                              spec.topic])
        else:
            cursor.execute(CREATE_GROUP_SQL, [spec.topic, spec.group, spec.queue, spec.start,
                                              spec.start, earliest, spec.topic])
        return int(cursor.rowcount) == 1


def position(topic: str, group: str, alias: str | None = None) -> int | None:
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(POSITION_SQL, [topic, group])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def delivery_payload(value: str, offset: int, key: str | None, published_at: dt.datetime | None
             ) -> str:
    """The delivery's task payload: the message's JSON as the one argument (not parsed
    again: a row changed by hand into bad JSON fails its delivery, not the pump). A
    zero ``published_at`` (changed by hand; the driver reads it as None) goes as null:
    its delivery fails saying so, not the pump."""
    if published_at is not None and published_at.tzinfo is None:
        published_at = published_at.replace(tzinfo=dt.UTC)
    meta = json.dumps({"offset": offset, "key": key, "published_at":
                       None if published_at is None else published_at.isoformat()})
    return f'{{"args":[{value}],"kwargs":{meta}}}'


def delivery(spec: GroupSpec, row: Sequence[Any]) -> NewMessage:
    """The delivery of one topic row ``(offset, key, payload JSON, published_at)``."""
    offset, key, value, published_at = int(row[0]), row[1], str(row[2]), row[3]
    return NewMessage(
        task_name=spec.task_name, queue=spec.queue, priority=0,
        payload=delivery_payload(value, offset, key, published_at), run_at=None, delay=0.0,
        max_attempts=spec.max_attempts, retry_backoff=spec.retry_backoff,
        timeout=spec.timeout, dedup_key=None,
        # One ordered subject per key and topic within the group's queue.
        gate_key=None if key is None else f"{spec.topic}:{key}",
        gate_mode=None if key is None else spec.on_dead,
        gate_limit=None if key is None else 1,
    )


def pump(spec: GroupSpec, batch: int, window: int, alias: str | None = None,
         least: int = 1) -> int:
    """Turn up to ``batch`` messages after the group's position into deliveries; return
    how many. Nothing when another member is pumping, or ``window`` deliveries wait
    (ready, or scheduled for a retry: see ``group_window`` for when retries count), or
    ``BLOCKED_WINDOWS * window`` are blocked behind
    their key, or a delivery is ready and there is room for fewer than ``least`` more (a
    draining member then pumps one big batch now and then, not a few rows every round;
    with none ready, retries scheduled for later don't make it wait for that much room)."""
    return pump_group(spec, batch, window, alias, least).made


def group_behind(spec: GroupSpec, alias: str | None = None, window: int | None = None
                 ) -> bool:
    """Whether the group has messages not pumped yet: sequenced ones after its position,
    or committed messages of its topic that lack an offset (its pump stamps those). A
    ``--burst`` member ends only once this is false.

    With ``window`` (the pump's), a group whose pump waits at its window or blocked bound
    is not behind: ``--burst`` asks only once none of its queues' deliveries is ready,
    running or due within ``--burst-wait``, and then those filling the bound (retries
    scheduled later, deliveries blocked behind a dead or held one) won't make room in
    that time. Its backlog stays in the topic for the next run (a member waited for good
    at a held key, or through the whole retry schedule)."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(BEHIND_SQL, [spec.topic, spec.group])
        look = cursor.fetchone()
        if look is None:
            return False  # no such group
        behind = look[0] is None or bool(look[0]) or bool(look[1])
        if not behind or window is None:
            return behind
        bound = BLOCKED_WINDOWS * window
        cursor.execute(AT_BOUND_SQL, [spec.queue, window, window, spec.queue, bound, bound])
        full = cursor.fetchone()
        if full is None or None in full:
            return True  # (a wake-up's KILL QUERY cut a count short: look again)
        if full[1]:
            return False
        # (Not held, or an answer cut short: look again.)
        return not full[0] or retries_hold(cursor, spec.queue, window).held is not True


def pump_claims_supported(alias: str | None = None) -> bool:
    """Whether :func:`pump_claiming` can claim (MariaDB: ``INSERT … RETURNING``)."""
    return bool(connection_for(alias or default_alias()).mysql_is_mariadb)  # type: ignore[attr-defined]


def pump_group(spec: GroupSpec, batch: int, window: int, alias: str | None = None,
               least: int = 1, sequence: bool = False, keep: int = 0,
               recreate: bool = False) -> Pumped:
    """:func:`pump`, saying whether the group was behind. With ``sequence``, a group that
    is not behind while committed messages of its topic lack an offset stamps them and
    pumps them in one transaction (the group's row, then the topic's, both ``SKIP
    LOCKED``: one fsync and no wait on the way from a publish to its delivery).

    The window is the look's count: two members pumping one after the other off the same
    look may pass it by one batch. ``keep``: deliveries the caller claims itself right
    after (a member that pumped one message wakes no other member for it). ``recreate``:
    a group without a row gets one again (a member's, whose group was created at its
    start: the row was deleted while it ran), after its last delivery."""
    return pump_claiming(spec, batch, window, None, alias, least, sequence, keep,
                         recreate)[0]


def pump_claiming(spec: GroupSpec, batch: int, window: int, claim: PumpClaim | None,
                  alias: str | None = None, least: int = 1, sequence: bool = False,
                  keep: int = 0, recreate: bool = False, woken: bool = False
                  ) -> tuple[Pumped, list[ClaimedMessage]]:
    """:func:`pump_group` for a member with room to run ``claim.count`` deliveries now.

    When no delivery of the group is ready, it pumps only that many (within the window's
    room) and inserts them already claimed by the member (a keyed one blocked behind its
    key's earlier delivery stays blocked); they are read back like a claim's batch and
    returned. While deliveries are ready, it pumps by the window as before and claims
    nothing: the member's claim takes the ready ones first. Either way nothing while
    ``window`` deliveries are ready or scheduled (retries, while its handler fails:
    ``group_window``), or ``BLOCKED_WINDOWS`` times that many are blocked. A pump that
    took all it could while the group is still behind wakes another member (one parked
    would not hear of the rest otherwise).

    ``woken`` (a member just woken from its park, by a publish most likely): straight
    into the transaction that stamps and claims, without the look (a statement less
    between a publish and its handler), unless a delivery of the group is ready or its
    window is full; one that finds nothing to do so looks as usual."""
    alias = alias or default_alias()
    if woken and sequence and claim is not None and claim.count > 0 \
            and pump_claims_supported(alias):
        take = min(claim.count, batch)
        made, claimed, oversized = _pump(
            spec, take, alias, sequence_first=True, keep=keep, woken=window,
            claim=PumpClaim(take, claim.worker_id, claim.lease_seconds))
        if made > 0 or oversized is not None:
            return Pumped(made, True, oversized=oversized), claimed
    with connection_for(alias).cursor() as cursor:
        cursor.execute(LOOK_SQL, [spec.queue, window, spec.queue, spec.queue,
                                  BLOCKED_WINDOWS * window, spec.queue, window, spec.topic,
                                  spec.group])
        look = cursor.fetchone()
        if look is not None and look[8] is not None and int(look[8]) >= weighed_from(window):
            # Half a window of retries or more: of a group whose handler works, they
            # don't hold its pump, only its ready ones count (group_window).
            hold = retries_hold(cursor, spec.queue, window)
            if hold.held is False:
                look = (*look[:1], hold.ready, *look[2:])
    if look is None:
        return (_missing(spec, alias) if recreate else Pumped(0, False)), []
    if None in (look[0], look[1], look[6], look[7]):
        # A producer's wake-up (KILL QUERY) that lands in the look's subquery can make
        # MariaDB answer NULL instead of error 1317 (seen in a chaos run): nothing is
        # known, so say "behind" and the worker looks again instead of parking.
        return Pumped(0, True), []
    behind, pending, unsequenced = bool(look[0]), int(look[1]), bool(look[2])
    noted, none_ready, blocked = bool(look[5]), bool(look[6]), int(look[7])
    if int(look[3]) > int(look[4]):  # a round sets it back (group_ahead); then look again
        stamped = in_transaction(alias, lambda cursor: sequence_round(
            cursor, spec.topic, SEQUENCE_BATCH, skip_locked=True))
        return Pumped(0, True, busy=stamped is None, ahead=(int(look[3]), int(look[4]))), []
    room = window - pending
    take = 0
    if room <= 0 or blocked >= BLOCKED_WINDOWS * window:
        return Pumped(0, behind, noted=noted), []
    if claim is not None and claim.count > 0 and none_ready and pump_claims_supported(alias):
        take = min(claim.count, batch, room)
    elif not none_ready and room < least:
        # (Only while a delivery is ready: a member claims those meanwhile. Retries
        # scheduled later run nothing, and waiting for half a batch of room behind them
        # left the room below it unpumped until some ended.)
        return Pumped(0, behind, noted=noted), []
    wanted = take or min(batch, room)
    claiming = (PumpClaim(take, claim.worker_id, claim.lease_seconds)
                if take and claim is not None else None)
    if behind:
        # (With nothing left after its position, a group that may sequence stamps the
        # topic's new messages, as a caught-up one does: see _pump.)
        made, claimed, oversized = _pump(spec, wanted, alias, keep=keep, claim=claiming,
                                         sequence_if_empty=sequence)
        return Pumped(max(made, 0), True, busy=made == -1, oversized=oversized,
                      group_lock=made != HELD), claimed
    if not (sequence and unsequenced):
        return Pumped(0, False, noted=noted), []
    made, claimed, oversized = _pump(spec, wanted, alias, sequence_first=True, keep=keep,
                                     claim=claiming)
    return Pumped(max(made, 0), False, busy=made == -1, oversized=oversized,
                  group_lock=made != HELD), claimed


def _missing(spec: GroupSpec, alias: str) -> Pumped:
    """The look found no row of the group (or of its topic): a member makes the group's
    again (its row deleted by hand while it runs), after its last delivery."""
    if not create_group(spec, alias, resume=True):
        return Pumped(0, False)  # (its topic has no row: a sequencing round makes it)
    logger.warning(
        "Group %r of topic %r had no row in %s (deleted while its members ran?): made it "
        "again at position %s (after its last delivery, or at its start %r if it had none).",
        spec.group, spec.topic, GROUP_TABLE, position(spec.topic, spec.group, alias),
        spec.start)
    return Pumped(0, True)


def _pump(spec: GroupSpec, wanted: int, alias: str, sequence_first: bool = False,
          keep: int = 0, claim: PumpClaim | None = None, sequence_if_empty: bool = False,
          woken: int = 0) -> tuple[int, list[ClaimedMessage], Oversized | None]:
    """The pump's transaction: up to ``wanted`` deliveries (-1 when it found the topic's
    row held, :data:`HELD` the group's), those it claimed for ``claim``, and the message
    it stopped before because its delivery would not fit in a statement (see oversized.py).

    ``sequence_first``: stamp the topic's new messages, then read. ``sequence_if_empty``:
    stamp them only when nothing is left after the group's position although it is
    behind the topic's last offset (retention that doesn't wait for groups deleted what
    it had not had; messages deleted or ``last_offset`` raised by hand). Such a group
    used to wait for another reader, or the recovery leader's next upkeep, to stamp its
    new messages. Its position stays: a raised ``last_offset`` put back later finds it
    where it was. ``woken`` (the window, see :func:`pump_claiming`): nothing when a
    delivery of the group is ready or the window is full, no more than its room otherwise,
    and a topic row another member holds doesn't end the pump: it reads what is sequenced
    (-1 only if nothing is)."""
    token = uuid.uuid4().hex
    room = row_room(alias)
    oversized: list[Oversized] = []

    def body(cursor: Any) -> tuple[int, list[str], list[ClaimedMessage]]:
        oversized.clear()
        if woken:
            cursor.execute(LOCK_GROUP_IF_ROOM_SQL, [
                spec.queue, woken, spec.topic, spec.group, spec.topic, spec.queue,
                weighed_from(woken), spec.queue, BLOCKED_WINDOWS * woken,
                BLOCKED_WINDOWS * woken])
        else:
            cursor.execute(LOCK_GROUP_SQL, [spec.topic, spec.group])
        row = cursor.fetchone()
        if row is None and not woken:
            return HELD, [], []  # (another member's pump, or a stranger: group_lock)
        if row is None or (woken and row[2] is None):
            # (A producer's wake-up landing in the count's subquery can make MariaDB
            # answer NULL, as in the look: nothing is known, so the member looks.)
            return 0, [], []
        group_id, current = int(row[0]), int(row[1])
        # (Woken: none is ready, so the window's room is what its scheduled ones leave.)
        limit = min(wanted, woken - int(row[2])) if woken else wanted
        held = False
        if sequence_first:
            # The sequencer's own round (topic row, then its consistent read): the
            # offsets it gives stay a gap-free prefix; this transaction sees its stamps.
            held = sequence_round(cursor, spec.topic, SEQUENCE_BATCH, skip_locked=True) is None
            if held and not woken:
                return -1, [], []
        cursor.execute(PUMP_READ_SQL, [room, spec.topic, current, limit])
        found = cursor.fetchall()
        if held and not found:
            return -1, [], []
        if not found and sequence_if_empty:
            stamped = sequence_round(cursor, spec.topic, SEQUENCE_BATCH, skip_locked=True)
            if stamped is None:
                return -1, [], []
            if stamped:
                cursor.execute(PUMP_READ_SQL, [room, spec.topic, current, limit])
                found = cursor.fetchall()
        fit = fitting(found, lambda r: delivery(spec, r), room)
        rows, messages = fit.rows, fit.messages
        if fit.oversized is not None:
            oversized.append(fit.oversized)
        if not rows:
            return 0, [], []
        statuses = gate_statuses(cursor, messages)
        ids, taken = insert_deliveries(alias, messages, fit.sizes, statuses, claim, token)
        params: list[Any] = []
        for message_id, found in zip(ids, rows, strict=True):
            params.extend((message_id, spec.topic, spec.group, int(found[0])))
        execute_escaped(cursor, LINK_SQL.format(rows=", ".join([_LINK_ROW] * len(ids))),
                        params)
        last = int(rows[-1][0])
        cursor.execute(MOVE_SQL, [last, group_id])
        # Ready for a claim: neither blocked behind their key nor claimed here.
        ready = [m.queue for m, status in zip(messages, statuses, strict=True)
                 if status != MessageStatus.BLOCKED][len(taken):]
        return len(rows), ready, taken

    pumped, queues, taken = in_transaction(alias, body)
    if pumped > 0:
        # A member that took all it could of a group still behind: wake another one.
        more = [spec.queue] if claim is not None and pumped >= wanted else []
        try:
            if queues[keep:] or more:
                wake([*queues[keep:], *more], alias)
        except DatabaseError as exc:  # the deliveries are committed; members poll them
            logger.warning("Could not wake the members of group %r (%s).", spec.group, exc)
        send_robust(topic_pumped, spec.topic, group=spec.group, count=pumped)
    return pumped, taken, (oversized[0] if oversized else None)

