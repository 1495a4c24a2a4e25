"""Queues with ready messages that no live worker serves: work that waits silently.

A live worker is one whose heartbeat is younger than a lease and that has not stopped
(as ``workers_alive`` counts them); each stores the queues it serves in ``mysqlq_worker``.
Reading which queues hold ready messages is the dashboard's skip scan of the claim index
(one index dive per (queue, status, priority) group), so the cost doesn't grow with the
backlog; the ready count of each unserved queue stops at a cap.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping

from django.utils import timezone

from ..conf import get_settings
from ..models import MessageStatus
from .base import WORKER_TABLE, connection_for, micros, placeholders
from .overview import (
    ENQUEUED_AT_SQL,
    QUEUE_STATUS_COUNT_SQL,
    QueueOverview,
    claim_groups,
)
from .session import database_now

#: The queues of every live worker, read along mysqlq_wrk_heartbeat (recent rows only).
SERVED_QUEUES_SQL = f"""
SELECT queues FROM {WORKER_TABLE} FORCE INDEX (mysqlq_wrk_heartbeat)
 WHERE last_heartbeat > UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND AND stopped_at IS NULL
"""
#: Where a worker's own count of an unserved queue's ready messages stops.
COUNT_CAP = 10_000


@dataclasses.dataclass(frozen=True)
class UnservedQueue:
    """A queue with ready messages and no live worker serving it."""

    queue: str
    ready: int
    #: ``ready`` stopped at the cap it was read with: there are more.
    capped: bool
    #: Seconds since its oldest ready message was enqueued.
    oldest_seconds: float | None

    def describe(self) -> str:
        """``emails (1,204 ready, oldest 3 min)``."""
        count = f"{self.ready:,}{'+' if self.capped else ''} ready"
        if self.oldest_seconds is None:
            return f"{self.queue} ({count})"
        return f"{self.queue} ({count}, oldest {age(self.oldest_seconds)})"

    def as_json(self) -> dict[str, object]:
        return {"queue": self.queue, "ready": self.ready, "ready_capped": self.capped,
                "oldest_ready_seconds": self.oldest_seconds}


def age(seconds: float) -> str:
    """``40 s``, ``3 min``, ``5 h``, ``2 days``: how long, at a glance."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def describe_unserved(unserved: Iterable[UnservedQueue]) -> str:
    """``queues with messages that no worker serves: emails (1,204 ready, oldest 3 min)``."""
    return ("queues with messages that no worker serves: "
            + ", ".join(queue.describe() for queue in unserved))


def served_queues(alias: str | None = None) -> set[str]:
    """Every queue some live worker serves."""
    with connection_for(alias).cursor() as cursor:
        cursor.execute(SERVED_QUEUES_SQL, [micros(get_settings().LEASE_SECONDS)])
        rows = cursor.fetchall()
    return {name for (queues,) in rows for name in str(queues).split(",") if name}


def unserved_from(overview: Mapping[str, QueueOverview], served: set[str],
                  now: dt.datetime) -> list[UnservedQueue]:
    """The unserved queues among those an overview read (the dashboard's counts)."""
    found = []
    for queue, view in sorted(overview.items()):
        ready = view.counts.get(MessageStatus.READY, 0)
        if ready and queue not in served:
            oldest = None if view.oldest_ready_at is None \
                else max(0.0, (now - view.oldest_ready_at).total_seconds())
            found.append(UnservedQueue(queue, ready, MessageStatus.READY in view.capped,
                                       oldest))
    return found


def unserved_queues(also_served: Iterable[str] = (), cap: int = COUNT_CAP
                    ) -> list[UnservedQueue]:
    """Queues with ready messages that no live worker (nor ``also_served``) serves.

    Counts only those queues' ready messages, each up to ``cap``: what a starting worker
    reads, at the cost of a few index dives whatever the backlog.
    """
    served = served_queues() | set(also_served)
    with connection_for().cursor() as cursor:
        oldest_id: dict[str, int] = {}
        for queue, status, _, first_id in claim_groups(cursor):
            if status == MessageStatus.READY and queue not in served:
                oldest_id[queue] = min(first_id, oldest_id.get(queue, first_id))
        if not oldest_id:
            return []
        queues = sorted(oldest_id)
        cursor.execute(" UNION ALL ".join([QUEUE_STATUS_COUNT_SQL] * len(queues)),
                       [p for q in queues for p in (q, MessageStatus.READY, q,
                                                    MessageStatus.READY, cap + 1)])
        counts = {str(q): int(n) for q, _, n in cursor.fetchall()}
        cursor.execute(ENQUEUED_AT_SQL.format(ids=placeholders(len(queues))),
                       [oldest_id[q] for q in queues])
        queue_of = {first_id: queue for queue, first_id in oldest_id.items()}
        # (A zero date, changed by hand, reads as None: its age is unknown.)
        enqueued = {queue_of[int(i)]: at for i, at in cursor.fetchall() if at is not None}
    now = database_now()
    return [UnservedQueue(q, min(counts.get(q, 0), cap), counts.get(q, 0) > cap,
                          max(0.0, (now - _aware(enqueued[q])).total_seconds())
                          if q in enqueued else None)
            for q in queues if counts.get(q, 0)]


def _aware(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if timezone.is_naive(value) else value
