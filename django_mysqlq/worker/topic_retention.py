"""Topic retention, run by the recovery leader beside the queue's (see retention.py):
``MYSQLQ['TOPIC_RETENTION_SECONDS']`` (None keeps messages forever) and
``TOPIC_RETENTION_WAIT_FOR_GROUPS``. Short batches per topic, in turn, while a busy
topic has more and the call's budget lasts.

Before it, :func:`sequence_unread` gives offsets to the messages of topics that no
running worker reads: retention, lookup and the statistics go by offset."""

from __future__ import annotations

import datetime as dt
import logging
import time

from django.db import DatabaseError

from .. import broker
from ..broker.topic_retention import tables_held
from ..conf import get_settings
from ..log import Failures, one_line
from .retention import BATCH, BATCHES_PER_CALL

logger = logging.getLogger("django_mysqlq")

#: Topics whose sequencing failed at the last call: logged once per topic and kind of
#: error, not at every upkeep (and on the worker's row: ``troubles``).
failing: Failures[str] = Failures()
#: Topics whose retention failed at the last call (logged the same way).
pruning: Failures[str] = Failures()

#: Topics whose retention was still behind its cut-off when the budget ran out (warned
#: once, until a call leaves them caught up).
behind: set[str] = set()

#: Retention per upkeep: every topic gets ``BATCHES_PER_CALL`` batches of ``BATCH``,
#: then the topics whose batches all came back full get more, in turn, while this budget
#: lasts (it runs on the leader's control loop, once per ``LEASE_SECONDS``).
PRUNE_BUDGET_SECONDS = 2.0

#: Sequencing of topics nobody reads, per upkeep: at most this many rounds of 1,000 per
#: topic, and after each topic's first round only while this budget lasts (it runs on
#: the leader's control loop). A round of 1,000 took 17 ms here: about 60,000 messages a
#: second's budget, some 2,000 a second of publishing kept up with at the default
#: 30-second upkeep.
UNREAD_ROUNDS = 200
UNREAD_BUDGET_SECONDS = 1.0


def sequence_unread() -> dict[str, int]:
    """Give offsets to committed messages no reader has sequenced (a topic without a
    running member or broadcast subscriber); return how many per topic."""
    failed: set[str] = set()

    def on_error(topic: str, exc: DatabaseError) -> None:
        failed.add(topic)
        if failing.failed(topic, exc):
            logger.error(
                "The recovery leader could not give offsets to messages of topic %r that "
                "have none: %s. No group or broadcast reader gets them until it can; the "
                "other topics go on, and this one is tried again at every upkeep (said "
                "again only for a new kind of error). Check its row in mysqlq_topic: a "
                "last_offset or first_offset changed by hand is the usual cause.",
                topic, one_line(str(exc)))

    done = broker.sequence_unread(UNREAD_ROUNDS, budget_seconds=UNREAD_BUDGET_SECONDS,
                                  on_error=on_error)
    for topic in [name for name in failing.keys() if name not in failed]:
        failing.recovered(topic)
        logger.info("Topic %r is sequenced again by the recovery leader.", topic)
    for topic, count in done.items():
        logger.info("Gave offsets to %d message(s) of topic %r that no running worker reads "
                    "(no member of its groups, no broadcast subscriber), so that retention, "
                    "lookups and statistics see them.", count, topic)
    return done


def prune() -> dict[str, int]:
    """Delete what topic retention allows; return the messages deleted per topic.

    Each topic gets :data:`BATCHES_PER_CALL` batches, taken in turn; a topic whose
    batches all came back full gets more turns while :data:`PRUNE_BUDGET_SECONDS` last
    (a busy topic must catch up, not stay 1,000 messages an upkeep behind)."""
    conf = get_settings()
    if conf.TOPIC_RETENTION_SECONDS is None:
        return {}
    before = broker.database_now() - dt.timedelta(seconds=conf.TOPIC_RETENTION_SECONDS)
    deadline = time.monotonic() + PRUNE_BUDGET_SECONDS
    done: dict[str, int] = {}
    pending = names = broker.topic_names()
    turn = 0
    while pending and (turn == 0 or time.monotonic() < deadline):
        pending = [topic for topic in pending
                   if _turn(topic, before, conf.TOPIC_RETENTION_WAIT_FOR_GROUPS, done,
                            None if turn == 0 else deadline)]
        turn += 1
    _note_behind(set(pending), set(names) - set(pruning.keys()), before)
    for topic, deleted in done.items():
        logger.info("Retention: deleted %d message(s) of topic %r published before %s "
                    "UTC.", deleted, topic, f"{before:%Y-%m-%d %H:%M}")
    return done


def _turn(topic: str, before: dt.datetime, wait_for_groups: bool, done: dict[str, int],
          deadline: float | None) -> bool:
    """Up to :data:`BATCHES_PER_CALL` batches of ``topic`` (none past ``deadline``);
    whether it has more (every batch came back full, or the budget ran out first)."""
    if deadline is not None and time.monotonic() >= deadline:
        return True
    deleted = 0
    full = False
    try:
        for _ in range(BATCHES_PER_CALL):
            count = broker.prune_topic_batch(topic, before, BATCH,
                                             wait_for_groups=wait_for_groups)
            deleted += count
            full = count >= BATCH
            if not full:
                break
    except DatabaseError as exc:
        if broker.connection_lost() or (broker.is_lock_wait(exc) and tables_held()):
            # Every topic would fail (or wait) the same: the upkeep step is given up,
            # with one warning, and tried again next round.
            raise
        full = False
        # One topic's trouble (its row locked by a stranger past the lock wait, a
        # value changed by hand) must not stop the retention of the others.
        if pruning.failed(topic, exc):
            logger.error(
                "Retention of topic %r failed: %s. Its old messages stay until it can "
                "(%d deleted this round); the other topics go on, and this one is tried "
                "again at every upkeep (said again only for a new kind of error). A "
                "session holding its row in mysqlq_topic, or a row changed by hand, is "
                "the usual cause.", topic, one_line(str(exc)), deleted)
    else:
        if pruning.recovered(topic):
            logger.info("Retention of topic %r works again.", topic)
    if deleted:
        done[topic] = done.get(topic, 0) + deleted
    return full


def _note_behind(still: set[str], working: set[str], before: dt.datetime) -> None:
    """Warn once per episode of a topic still holding a full batch past the cut-off when
    the budget ran out; say when it caught up (a failing topic is said by its error)."""
    for topic in sorted(still - behind):
        logger.warning(
            "Retention of topic %r is falling behind: messages published before %s UTC "
            "were still left when this upkeep's %.1f s for retention ran out. They go at "
            "the next upkeeps (every LEASE_SECONDS); if this lasts, the topic is published "
            "to faster than the recovery leader deletes (docs/streams.md, Retention).",
            topic, f"{before:%Y-%m-%d %H:%M}", PRUNE_BUDGET_SECONDS)
    caught_up = (behind - still) & working
    for topic in sorted(caught_up):
        logger.info("Retention of topic %r caught up with its cut-off.", topic)
    behind.difference_update(caught_up)
    behind.update(still)
