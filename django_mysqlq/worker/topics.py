"""A worker's topic duties: the groups it is a member of, and its broadcast reader.

Members of a group are the workers whose queues include ``group:<group>`` (``--groups``,
or every known queue by default). The control loop calls :meth:`TopicDuty.pump` before
it claims: each group's next messages become deliveries in its queue
(``broker.pump_group``: a look first, then a transaction only when the group is behind,
and while a delivery of the group is ready only once the window has room for half of
``min(TOPIC_PUMP_BATCH, TOPIC_WINDOW)``; a group that has every
sequenced message gives its topic's new ones their offsets in the same transaction,
never waiting for another member's round), which the claim then takes like any message.
Broadcast subscriptions run in a thread of every worker process.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from django.db import DatabaseError

from .. import awaiting, broker, payload
from ..conf import QueueSettings, get_settings
from ..exceptions import PayloadDecodeError
from ..log import Failures, one_line
from ..messages import ClaimedMessage
from ..routing import bind_alias, on_alias
from ..topics import Subscription, TopicEvent, subscriptions
from . import fatal
from .group_holds import HELD_LOG_SECONDS, GroupHolds
from .group_trouble import GroupTrouble
from .queues import in_turn
from .topic_setup import TopicSetup, held_advice, made, sequence_at_start

logger = logging.getLogger("django_mysqlq")

#: Shortest pause between two pumps of a busy worker (a parked one pumps before parking).
PUMP_SECONDS = 0.02
#: A topic's row held by someone else is followed as a group's is (group_holds).
HELD_LONGEST_PAUSE = 1.0
#: Messages a broadcast reader takes per read.
BROADCAST_BATCH = 500
#: Bytes of payloads a broadcast reader takes per read (always one message at least, so a
#: bigger one moves alone). 500 payloads of MAX_PAYLOAD_BYTES (1 MB by default) are 500 MB
#: in one read, gigabytes where it was raised near the server's packet. Ordinary messages
#: (kilobytes) still come 500 a read, and one read (the driver's rows, their text, the
#: decoded values) stays within tens of MiB a process.
BROADCAST_BYTES = 16 * 2**20


class Claimer(Protocol):
    """The worker's side of a pump that claims for it (``broker.pump_claiming``)."""

    id: str

    def pump_room(self, queue: str) -> int:
        """How many deliveries of ``queue`` it takes now (reserved: the pump gives back
        the rest); 0 when it has no room, -1 when it does not claim from ``queue`` now
        (paused): the group is then pumped by its window as without a claimer."""

    def pump_took(self, messages: list[ClaimedMessage], reserved: int) -> None:
        """The pump claimed ``messages`` of the ``reserved`` (or raised: ``[]``)."""


def group_spec(subscription: Subscription) -> broker.GroupSpec:
    """What the pump needs of a group subscription (its task's options)."""
    task = subscription.task
    assert task is not None and subscription.group is not None
    return broker.GroupSpec(
        topic=subscription.topic, group=subscription.group, queue=task.queue,
        task_name=task.name, on_dead=subscription.on_dead, max_attempts=task.max_attempts,
        retry_backoff=task.retry_backoff, timeout=task.timeout, start=subscription.start)


class TopicDuty:
    """Pumps the groups this worker serves; runs its broadcast reader."""

    def __init__(self, queues: Sequence[str], stop: threading.Event,
                 settings: QueueSettings, keep: int = 0, broadcast: bool = True) -> None:
        served = [s for s in subscriptions.groups() if s.queue in set(queues)]
        self.specs = [group_spec(s) for s in served]
        self.topics = sorted({spec.topic for spec in self.specs})
        self.settings = settings
        #: Deliveries a pump leaves to this worker's next claim (its claim batch) rather
        #: than waking other members for them.
        self.keep = keep
        self.stop = stop
        self._last_pump = 0.0
        #: A wake-up came since the last pump: a member of one group pumps without
        #: looking first (``pump_claiming(woken=True)``).
        self._woken = False
        #: The last pump took all it could for this worker of a group still behind: the
        #: next one need not wait for the pause between two pumps.
        self._more = False
        #: Deliveries the last :meth:`pump` claimed for this worker.
        self.taken = 0
        self._claim_support: bool | None = None
        self._turn = 0
        self._claim_turn = 0
        #: Another member held a topic's sequencing lock at the last pump: its commit
        #: wakes nobody here, so the worker looks again shortly instead of parking.
        self.sequencer_busy = False
        #: Topics whose row another session has held at every look since (monotonic),
        #: and those of them logged.
        self._held_since: dict[str, float] = {}
        self._held_logged: set[str] = set()
        #: Groups whose row another session holds (a stranger's lock stops the group).
        self.group_holds = GroupHolds()
        #: Groups whose pump fails on its own or stopped where an operator must help.
        self.trouble = GroupTrouble()
        #: Groups whose row (or their topic's) a stranger's lock kept from being made.
        self.setup = TopicSetup()
        self.reader: BroadcastReader | None = None
        listeners = subscriptions.broadcast() if broadcast else []
        if listeners:
            self.reader = BroadcastReader(listeners, stop, settings.TOPIC_BROADCAST_POLL_SECONDS)

    def claim_order(self, active: Sequence[str],
                    held: Callable[[], Mapping[str, int]]) -> list[str]:
        """The worker's claim order for its next claim: among its groups, the one holding
        fewest of its claims (``held()``, by queue) first, ties in turn
        (``queues.in_turn``), so none waits behind another's backlog."""
        if len(self.specs) < 2:
            return list(active)
        self._claim_turn += 1
        return in_turn(active, {spec.queue for spec in self.specs}, self._claim_turn, held())

    def start(self) -> None:
        """Create this worker's groups (where they have no row) and start the broadcast
        reader at the latest offset of its topics."""
        for topic in self.topics:  # (a row held by a stranger is left for later)
            if self.stop.is_set():
                return
            self.setup.start(topic, [spec for spec in self.specs if spec.topic == topic])
        if self.reader is not None and not self.reader.is_alive():
            self.reader.begin()
            self.reader.start()

    def pump(self, force: bool = False, claimer: Claimer | None = None) -> int:
        """Sequence the topics and pump each group; return the deliveries made. With a
        ``claimer``, a group with no delivery waiting gets only as many as it has room
        for, claimed for it in the pump (``taken``)."""
        self.taken = 0
        if not self.specs:
            return 0
        now = time.monotonic()
        if not force and not self._more and now - self._last_pump < PUMP_SECONDS:
            return 0
        self._last_pump = now
        # (A member of several groups doesn't know which one the wake-up was for.)
        woken, self._woken = self._woken and len(self.specs) == 1, False
        conf = self.settings
        least = max(1, min(conf.TOPIC_PUMP_BATCH, conf.TOPIC_WINDOW) // 2)
        made, busy, more, looked = 0, False, False, False
        # Each round starts at the next group: the room a worker has goes to its groups
        # in turn, not always to the first (a member of several groups serves them all).
        self._turn = (self._turn + 1) % len(self.specs)
        self.setup.retry()
        for spec in [*self.specs[self._turn:], *self.specs[:self._turn]]:
            # A group that has every sequenced message sequences its topic's new ones in
            # its pump's transaction; one still behind has work without them.
            if self.trouble.resting(spec, now) or self.setup.waits(spec):
                continue  # (before pump_room: the room it reserves is given back below)
            room = claimer.pump_room(spec.queue) if claimer is not None else -1
            if room == 0 and self._claims():
                continue  # no room: it pumps for itself once it has some
            looked = True
            claim = (broker.PumpClaim(room, claimer.id, conf.LEASE_SECONDS)
                     if claimer is not None and room > 0 else None)
            claimed: list[ClaimedMessage] = []
            try:
                pumped, claimed = broker.pump_claiming(
                    spec, conf.TOPIC_PUMP_BATCH, conf.TOPIC_WINDOW, claim, least=least,
                    sequence=True, keep=self.keep, recreate=True, woken=woken)
            except Exception as exc:
                # (Not only database errors: a row changed by hand into what the code
                # can't take must stop its group's pump, not the worker.)
                if not self.trouble.failed(spec, exc):
                    raise
                continue
            finally:
                if claimer is not None and room > 0:
                    claimer.pump_took(claimed, room)
            self.trouble.pumped(spec, pumped)
            self.taken += len(claimed)
            self._note_held(spec.topic, pumped)
            self.group_holds.note(spec, pumped)
            made += pumped.made
            busy = busy or pumped.busy or pumped.group_lock is False
            more = more or (bool(claimed) and pumped.behind and len(claimed) >= room)
        self.sequencer_busy = busy
        if looked:  # (a round with no room leaves it: the next one with room runs at once)
            self._more = more
        return made

    def behind(self, active: Sequence[str]) -> bool:
        """Whether a group of an ``active`` queue has messages not pumped yet (a
        ``--burst`` member pumps until its groups have caught up with their topics). Asked
        only once no delivery is ready, running or due within ``--burst-wait``: a group
        whose pump waits at its window or blocked bound has caught up for it."""
        window = self.settings.TOPIC_WINDOW
        return any(broker.group_behind(spec, window=window) for spec in self.specs
                   if spec.queue in active and not self.trouble.waits_for_operator(spec))

    def busy_pause(self) -> float:
        """How long to wait before looking again while a topic's (or group's) row is held:
        short while it is another member's round, up to a second while a stranger keeps it."""
        held_since = [*self._held_since.values(), *self.group_holds.since.values()]
        if not held_since:
            return PUMP_SECONDS
        held = time.monotonic() - min(held_since)
        return min(HELD_LONGEST_PAUSE, max(PUMP_SECONDS, held / 20))

    def _note_held(self, topic: str, pumped: broker.Pumped) -> None:
        """Follow a topic's row held by another session; log one that stays held."""
        now = time.monotonic()
        if pumped.busy:
            since = self._held_since.setdefault(topic, now)
            if now - since >= HELD_LOG_SECONDS and topic not in self._held_logged:
                self._held_logged.add(topic)
                logger.warning(
                    "Topic %r: another session has held its row in mysqlq_topic for %.0f s "
                    "(a transaction left open? see information_schema.INNODB_TRX): messages "
                    "published since wait for their offsets, and no group gets them until "
                    "it ends; publishing and the groups' other deliveries go on.",
                    topic, now - since)
        elif topic in self._held_since and (pumped.made or (
                not pumped.behind and broker.try_sequence(topic) is not None)):
            # (A look that saw nothing to stamp is asked again, by taking the row: one
            # cut short by a producer's wake-up must not end the episode.)
            since = self._held_since.pop(topic)
            if topic in self._held_logged:
                self._held_logged.discard(topic)
                logger.warning("Topic %r: its row is free again after %.0f s; its messages "
                               "get their offsets.", topic, now - since)

    def _claims(self) -> bool:
        """Whether pumps claim for this worker (MariaDB: ``INSERT … RETURNING``)."""
        if self._claim_support is None:
            self._claim_support = broker.pump_claims_supported()
        return self._claim_support

    def woken(self) -> None:
        """A wake-up came (a publish, or another member's pump): the next pump runs at
        once, not after the rest of the pause between two pumps."""
        self._last_pump = 0.0
        self._woken = True


class BroadcastReader(threading.Thread):
    """Reads its topics after an in-memory position and calls the broadcast handlers.

    The position starts at each topic's last offset when the process starts and lives
    only here: nothing is acked or retried, a failing handler is logged.
    """

    def __init__(self, listeners: Sequence[Subscription], stop: threading.Event,
                 poll: float) -> None:
        super().__init__(name="mysqlq-broadcast", daemon=True)
        self.listeners: dict[str, list[Subscription]] = {}
        for listener in listeners:
            self.listeners.setdefault(listener.topic, []).append(listener)
        self.stop_event = stop
        #: Set by the worker's drain: a ``--burst`` run ends without its stop event, and a
        #: worker run in-process would leave the reader reading on.
        self.halted = threading.Event()
        self.poll = poll
        self.positions: dict[str, int] = {}
        #: The order a poll reads the topics in: one whose read left no connection goes
        #: last (see :meth:`read_once`).
        self.order: list[str] = list(self.listeners)
        #: Topics whose read fails: a lasting cause is logged once, not at every poll.
        self.failing: Failures[str] = Failures()

    def begin(self) -> None:
        """Take the starting positions (on the caller's connection to the topics'
        database, before the worker counts as started: a worker of another database
        must not take them from its own)."""
        alias = get_settings().DATABASE
        with on_alias(alias):
            try:
                self._begin()
            except DatabaseError as exc:
                # (Here, not in the worker's handler: it closes its own database's
                # connection, and a dead one to the topics' would fail every retry.)
                broker.close_if_broken()
                fatal.ran_on(exc, alias)  # its advice names this alias, not the worker's
                raise

    def _begin(self) -> None:
        for topic in self.listeners:
            if not made(functools.partial(broker.ensure_topic, topic)):
                logger.warning("Topic %r: its row could not be made: %s. Its broadcast "
                               "handlers hear its messages once it is (from its first "
                               "offset).", topic, held_advice("mysqlq_topic"))
            # Another process stamping the topic's backlog holds its row for that
            # round: the last offset read before it ends would be older than the
            # backlog, and this process would hear messages published before it began.
            sequence_at_start(topic, wait=True)
            self.positions[topic] = broker.last_offset(topic)

    def stopping(self) -> bool:
        return self.stop_event.is_set() or self.halted.is_set()

    def finish(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a handler running when the worker stopped (it is
        :meth:`stopping`: none starts after it); whether the reader ended."""
        if self.is_alive():
            self.join(max(0.0, seconds))
        return not self.is_alive()

    def run(self) -> None:
        # Where topics live, whoever started it. The session is not made the broker's
        # (READ COMMITTED, broker.own_connection): the handlers run on it at the site's
        # level, as tasks do; the broker's transactions here set their level for
        # themselves (isolation.transaction_prelude).
        bind_alias(get_settings().DATABASE)
        while not self.stopping():
            if not self.read_once():
                self.stop_event.wait(self.poll)

    def read_once(self) -> int:
        """Read each topic once; return how many messages were read. A topic whose read
        fails (a row changed by hand, a statement timeout) is logged and tried again at
        the next poll: it holds back none of the others."""
        read = 0
        for topic in list(self.order):
            if self.stopping():
                break
            try:
                read += self._read_topic(topic)
            except DatabaseError as exc:
                gone = broker.connection_lost()
                broker.close_if_broken()
                self._failed(topic, exc, gone)
                if gone:
                    # No connection left (lost, or the server is unreachable): the other
                    # topics would only fail the same way, each after its own connect
                    # attempt. The next poll reconnects and reads this topic last, so one
                    # whose read breaks the connection every time starves none of them.
                    self.order.remove(topic)
                    self.order.append(topic)
                    break
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any one topic
                self._failed(topic, exc, gone=False)
            else:
                self._recovered(topic)
        return read

    def _read_topic(self, topic: str) -> int:
        """Sequence ``topic`` unless a member is at it, read on from its position (at most
        :data:`BROADCAST_BATCH` messages and :data:`BROADCAST_BYTES` of payloads) and
        call its handlers; return how many messages were read."""
        broker.try_sequence(topic)  # (held: a member is stamping; read what is there)
        rows = broker.read_after(topic, self.positions[topic], BROADCAST_BATCH,
                                 max_bytes=BROADCAST_BYTES)
        for row in rows:
            if self.stopping():
                break  # the worker stops: no handler starts after its signal
            if row.payload is None:
                _skip_oversized(topic, row)
            else:
                self._handle(topic, self.listeners[topic], row.offset, row.key, row.payload,
                             row.published_at)
            self.positions[topic] = row.offset
        return len(rows)

    def _failed(self, topic: str, exc: Exception, gone: bool) -> None:
        """Log a topic's failed read once per kind of error (its class and code) until
        the topic reads again: a lasting cause would log at every poll."""
        if not self.failing.failed(topic, exc):
            return
        then = ("It left no connection: the next poll reconnects and reads this topic last."
                if gone else "The other topics go on; this one is read again at the next poll.")
        logger.warning("Broadcast reader: reading topic %r failed (logged once until it "
                       "reads again): %s. %s", topic, one_line(str(exc)), then)

    def _recovered(self, topic: str) -> None:
        """Close a topic's failing episode with a line saying it reads again."""
        if self.failing.recovered(topic):
            logger.warning("Broadcast reader: topic %r reads again.", topic)

    def _handle(self, topic: str, listeners: Sequence[Subscription], offset: int,
                key: str | None, text: str, published_at: dt.datetime | None) -> None:
        try:
            args, _ = payload.decode(f'{{"args":[{text}]}}')
        except PayloadDecodeError as exc:
            logger.error("Broadcast message %s@%d has a payload that isn't JSON (%s): "
                         "skipped.", topic, offset, exc)
            return
        if len(args) != 1 or published_at is None:
            # Changed by hand: a payload that is no single JSON value ('' or '1, 2' read
            # as none or two), a zero publish time (the driver reads it as None).
            logger.error("Broadcast message %s@%d was changed by hand (%s): skipped.", topic,
                         offset, "its payload is not one JSON value" if len(args) != 1
                         else "its published_at is a zero date")
            return
        if published_at.tzinfo is None:
            published_at = published_at.replace(tzinfo=dt.UTC)
        event = TopicEvent(topic=topic, offset=offset, key=key, payload=args[0],
                           published_at=published_at)
        for listener in listeners:
            if self.stopping():
                return
            name = getattr(listener.handler, "__qualname__", listener.handler)
            marks = broker.activity_marks()
            try:
                awaiting.call(listener.handler, event)
            except BaseException:
                # (BaseException: a handler's SystemExit, or an async one's CancelledError,
                # would end the reader's thread, and the process would hear no more.)
                logger.exception("Broadcast handler %s failed on %s@%d.", name, topic, offset)
            _clean_up_after(name, topic, offset, marks)


def _clean_up_after(name: object, topic: str, offset: int,
                    marks: dict[str, broker.Mark]) -> None:
    """What a task thread does after each task, after each broadcast handler: a
    transaction it left open (on any database) is rolled back and logged, and a
    connection it left broken is closed. Left as it was, an open one on the topics'
    database would hold the reader's next locking read of a topic's row (and its
    stamps) uncommitted for the life of the process: no reader or member anywhere could
    give that topic an offset again; a broken one would fail every later handler."""
    left_open = broker.close_open_transactions(marks)
    if left_open:
        logger.error("Broadcast handler %s returned from %s@%d with a transaction still "
                     "open on database(s) %s: its uncommitted writes were rolled back. "
                     "Leave every transaction.atomic() block you enter and don't turn "
                     "autocommit off.", name, topic, offset, ", ".join(left_open))
    broker.close_broken_connections()


def _skip_oversized(topic: str, row: broker.ReadMessage) -> None:
    """A message past the room of one row (stored by hand, by an older version, or before
    the server's packet was lowered): no group of the topic can get it, and reading it
    whole could hold the reader for good (see broker/oversized.py). Broadcast retries
    nothing: it is logged and skipped."""
    logger.error(
        "Broadcast message %s@%d is too big to read: its payload takes %d bytes, more "
        "than the server's max_allowed_packet allows in one row (%d): skipped. Raise "
        "max_allowed_packet on the server (and restart the workers) for its handlers to "
        "get such messages; the groups of the topic stop before it (see queuetopic groups).",
        topic, row.offset, row.size, row.room)
