"""Topic retention, run by the recovery leader beside the queue's (see retention.py):
``MYSQLQ['TOPIC_RETENTION_SECONDS']`` (None keeps messages forever) and
``TOPIC_RETENTION_WAIT_FOR_GROUPS``. A few short batches per topic per call.

Before it, :func:`sequence_unread` gives offsets to the messages of topics that no
running worker reads: retention, lookup and the statistics go by offset."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import DatabaseError

from .. import broker
from ..conf import get_settings
from ..log import Failures, one_line
from .retention import BATCH, BATCHES_PER_CALL

logger = logging.getLogger("django_mysqlq")

#: Topics whose sequencing failed at the last call: logged once per topic and kind of
#: error, not at every upkeep (and on the worker's row: ``troubles``).
failing: Failures[str] = Failures()
#: Topics whose retention failed at the last call (logged the same way).
pruning: Failures[str] = Failures()

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
    """Delete what topic retention allows; return the messages deleted per topic."""
    conf = get_settings()
    if conf.TOPIC_RETENTION_SECONDS is None:
        return {}
    before = broker.database_now() - dt.timedelta(seconds=conf.TOPIC_RETENTION_SECONDS)
    done: dict[str, int] = {}
    for topic in broker.topic_names():
        deleted = 0
        try:
            for _ in range(BATCHES_PER_CALL):
                count = broker.prune_topic_batch(
                    topic, before, BATCH,
                    wait_for_groups=conf.TOPIC_RETENTION_WAIT_FOR_GROUPS)
                deleted += count
                if count < BATCH:
                    break
        except DatabaseError as exc:
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
            done[topic] = deleted
            logger.info("Retention: deleted %d message(s) of topic %r published before %s "
                        "UTC.", deleted, topic, f"{before:%Y-%m-%d %H:%M}")
    return done
