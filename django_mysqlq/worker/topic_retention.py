"""Topic retention, run by the recovery leader beside the queue's (see retention.py):
``MYSQLQ['TOPIC_RETENTION_SECONDS']`` (None keeps messages forever) and
``TOPIC_RETENTION_WAIT_FOR_GROUPS``. A few short batches per topic per call.

Before it, :func:`sequence_unread` gives offsets to the messages of topics that no
running worker reads: retention, lookup and the statistics go by offset."""

from __future__ import annotations

import datetime as dt
import logging

from .. import broker
from ..conf import get_settings
from .retention import BATCH, BATCHES_PER_CALL

logger = logging.getLogger("django_mysqlq")

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
    done = broker.sequence_unread(UNREAD_ROUNDS, budget_seconds=UNREAD_BUDGET_SECONDS)
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
        for _ in range(BATCHES_PER_CALL):
            count = broker.prune_topic_batch(
                topic, before, BATCH, wait_for_groups=conf.TOPIC_RETENTION_WAIT_FOR_GROUPS)
            deleted += count
            if count < BATCH:
                break
        if deleted:
            done[topic] = deleted
            logger.info("Retention: deleted %d message(s) of topic %r published before %s "
                        "UTC.", deleted, topic, f"{before:%Y-%m-%d %H:%M}")
    return done
