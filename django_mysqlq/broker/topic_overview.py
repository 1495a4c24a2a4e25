"""Read-only statements for monitoring topics: publish volume per topic, and the group
handlers running past their timeout. (Groups' positions and lag: :mod:`.topic_ops`.)"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from ..topicnames import GROUP_QUEUE_PREFIX, delivery_of_task
from .base import MESSAGE_TABLE, aware_utc, connection_for, default_alias, placeholders
from .deliveries import DELIVERY_TABLE
from .kept import checked_first
from .topics import TOPIC_MESSAGE_TABLE, TOPIC_TABLE

#: Windows of the publish-rate columns, in minutes.
WINDOWS = (1, 5, 60)

#: Topics the dashboard and ``queuestats`` rank (three counts each): a bound on the page.
#: The ones published to most recently (one dive into mysqlq_tmsg_published a topic):
#: a busy topic is among them whatever its name (taken in name order, one named after
#: the first 200 was never ranked), and whether or not its messages get offsets (by the
#: last stamping, a topic nobody reads, stamped once per upkeep, or one whose row a
#: stranger holds, fell behind the rest).
MAX_TOPICS = 200
#: Its last publish is that of its newest message kept (the last stamping where
#: retention deleted them all).
TOPICS_SQL = (f"SELECT name, last_offset, first_offset, COALESCE((SELECT MAX(published_at) "
              f"FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX (mysqlq_tmsg_published) WHERE topic = "
              "t.name), sequenced_at) AS last_publish, created_at "
              f"FROM {TOPIC_TABLE} t ORDER BY last_publish DESC, name LIMIT %s")
#: Messages of a topic published since a time, along mysqlq_tmsg_published.
PUBLISHED_SINCE_SQL = (f"SELECT COUNT(*) FROM {TOPIC_MESSAGE_TABLE} FORCE INDEX "
                       "(mysqlq_tmsg_published) WHERE topic = %s "
                       "AND published_at >= UTC_TIMESTAMP(6) - INTERVAL %s MINUTE")
#: Claimed deliveries (queues ``group:…``) whose handler has run past its timeout: timed
#: from the start the worker recorded (within a second of it), not from the claim (a claim
#: waits for a thread: up to a batch of them at a time). Read along the lease index, the
#: claimed messages only (as many as run at once, as STUCK_CANDIDATES_SQL): the claim
#: index's range on queue LIKE 'group:%' would read every delivery of every group, dead
#: letters included, status being its second column.
OVERRAN_SQL = f"""
SELECT id, queue, task_name, worker_id, claimed_at, timeout,
       TIMESTAMPDIFF(MICROSECOND, started_at, UTC_TIMESTAMP(6)) / 1e6,
       CASE WHEN JSON_VALID(payload) THEN JSON_EXTRACT(payload, '$.kwargs.offset') END
  FROM {MESSAGE_TABLE} FORCE INDEX (mysqlq_msg_lease)
 WHERE status = 'claimed' AND queue LIKE %s AND timeout IS NOT NULL
   AND started_at IS NOT NULL
   AND TIMESTAMPDIFF(MICROSECOND, started_at, UTC_TIMESTAMP(6)) > timeout * 1e6
 LIMIT %s
"""

#: The topic, group and offset of those deliveries (primary key lookups).
OVERRAN_LINKS_SQL = (f"SELECT message_id, topic, group_name, msg_offset FROM {DELIVERY_TABLE} "
                     "WHERE message_id IN ({ids})")


@dataclasses.dataclass
class TopicVolume:
    name: str
    last_offset: int
    first_offset: int
    last_publish: dt.datetime | None
    #: Messages published in the last 1, 5 and 60 minutes.
    published: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def kept(self) -> int:
        return max(0, self.last_offset - self.first_offset + 1)

    @property
    def rate_per_second(self) -> float:
        """Publish rate over the last minute."""
        return self.published.get(1, 0) / 60.0

    def as_json(self) -> dict[str, Any]:
        return {"topic": self.name, "last_offset": self.last_offset,
                "first_offset": self.first_offset, "kept": self.kept,
                "last_publish": self.last_publish.isoformat() if self.last_publish else None,
                "published": {f"{m}m": self.published.get(m, 0) for m in WINDOWS},
                "rate_per_second": round(self.rate_per_second, 2)}


def topic_volumes(alias: str | None = None) -> list[TopicVolume]:
    """Every topic with its publish volume, the busiest (last hour) first."""
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(TOPICS_SQL, [MAX_TOPICS])
        found = [TopicVolume(str(r[0]), int(r[1]), int(r[2]), aware_utc(r[3]))
                 for r in cursor.fetchall()]
        for topic in found:
            topic.first_offset = checked_first(cursor, topic.name, topic.first_offset,
                                               topic.last_offset)
            for minutes in WINDOWS:
                cursor.execute(PUBLISHED_SINCE_SQL, [topic.name, minutes])
                topic.published[minutes] = int(cursor.fetchone()[0])
    return sorted(found, key=lambda t: (-t.published[60], t.name))


@dataclasses.dataclass(frozen=True)
class Overran:
    """A group's delivery whose handler runs past its timeout."""

    message_id: int
    queue: str
    task_name: str
    worker_id: str
    claimed_at: dt.datetime
    timeout: float
    #: Seconds since its handler started (as the worker recorded it).
    running_seconds: float
    #: The topic, group and offset it delivers: from its mysqlq_topic_delivery link, else
    #: (retention or the archive deleted it) from its task name ``topic:<topic>:<group>``
    #: and its payload's ``kwargs.offset``; empty and None for a message of a group's
    #: queue that is no delivery.
    topic: str = ""
    group: str = ""
    offset: int | None = None


def overran_deliveries(limit: int = 100, alias: str | None = None) -> list[Overran]:
    with connection_for(alias or default_alias()).cursor() as cursor:
        cursor.execute(OVERRAN_SQL, [f"{GROUP_QUEUE_PREFIX}%", limit])
        rows = cursor.fetchall()
        links: dict[int, tuple[str, str, int]] = {}
        if rows:
            cursor.execute(OVERRAN_LINKS_SQL.format(ids=placeholders(len(rows))),
                           [int(r[0]) for r in rows])
            links = {int(r[0]): (str(r[1]), str(r[2]), int(r[3])) for r in cursor.fetchall()}
    # Sorted here: an ORDER BY id would sort every claimed delivery of every group.
    return sorted((Overran(int(r[0]), str(r[1]), str(r[2]), str(r[3] or ""),
                           aware_utc(r[4]) or r[4], float(r[5]), float(r[6]),
                           *links.get(int(r[0])) or _unlinked(str(r[2]), r[7]))
                   for r in rows), key=lambda found: found.message_id)


def _unlinked(task_name: str, offset: Any) -> tuple[str, str, int | None]:
    """Topic, group and offset of a delivery whose link row is gone, from what its message
    row still says (a payload changed by hand may give no offset)."""
    topic, group = delivery_of_task(task_name) or ("", "")
    if isinstance(offset, bytes):
        offset = offset.decode(errors="replace")
    text = str(offset) if offset is not None else ""
    return topic, group, int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None
