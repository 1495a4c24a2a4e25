"""The bounds of a consumer group's pump: what a group may keep in the queue table.

The window (``TOPIC_WINDOW``) counts the group's deliveries waiting to run: ready ones,
and its retries (``scheduled``) while its handler is failing: none of the newest
:data:`RECENT_ATTEMPTS` attempts in its queue succeeded. A group whose every delivery
fails fast so keeps its backlog in the topic instead of copying it into
``mysqlq_message`` as retries, and goes on once a retry succeeds. A group whose handler
works is not held by its retries (a few messages failing for hours must not stop the
rest) until there are :data:`SCHEDULED_WINDOWS` windows of them; its blocked deliveries
(behind a hot key, or one held by a dead delivery) stop it at :data:`BLOCKED_WINDOWS`
windows. The state is read from the newest attempts, not from a time: a group quiet for
a while (a deploy, a night, the gap between two ``--burst`` runs) is as it was. The check
reads a bounded stretch of the history, so it runs only where half a window of retries
waits (``retries_hold``); a woken member's quick pump leaves such a group to the look.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..models import CLAIM_INDEX
from .base import ATTEMPT_TABLE, MESSAGE_TABLE

#: A group's blocked deliveries (keyed ones behind their key's earlier delivery: a hot key,
#: or one held by a dead delivery with ``on_dead="hold"``) stop its pump at this many
#: windows: other keys go on past one held key for a while, and the rows stay bounded.
BLOCKED_WINDOWS = 10
#: A group's retries stop its pump at this many windows even while its handler works
#: (most of its deliveries failing, but not all).
SCHEDULED_WINDOWS = 10
#: A group none of whose newest this many attempts (its queue's history) succeeded counts
#: its retries in its window.
RECENT_ATTEMPTS = 50
#: How many of a group's deliveries of some statuses there are, counted up to a bound
#: (``%s``: the queue, the bound): a range of the claim index (queue, status, priority,
#: id), read up to the bound from the index alone.
COUNTED = (f"(SELECT COUNT(*) FROM (SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})"
           " WHERE queue = %s AND status {statuses} LIMIT %s) AS counted)")
PENDING = COUNTED.format(statuses="IN ('ready', 'scheduled')")
READY = COUNTED.format(statuses="= 'ready'")
SCHEDULED = COUNTED.format(statuses="= 'scheduled'")
BLOCKED = COUNTED.format(statuses="= 'blocked'")
NONE_READY = (f"NOT EXISTS(SELECT 1 FROM {MESSAGE_TABLE} FORCE INDEX ({CLAIM_INDEX})"
              " WHERE queue = %s AND status = 'ready')")
#: Whether the group's retries hold its pump (``%s``: the queue, its bound twice, the
#: queue, the attempts read): as many as their own bound, or none of the newest attempts
#: in its queue succeeded (the history's index on queue and time, newest first); then its
#: ready deliveries up to the window (``%s``: the queue, the window), the window's count
#: when the retries don't hold it.
RETRIES_HOLD_SQL = (
    f"SELECT {SCHEDULED} >= %s OR NOT EXISTS(SELECT 1 FROM (SELECT outcome FROM "
    f"{ATTEMPT_TABLE} FORCE INDEX (mysqlq_att_queue) WHERE queue = %s ORDER BY finished_at "
    f"DESC LIMIT %s) AS newest WHERE outcome = 'succeeded'), {READY}"
)
#: Whether the group's pump waits at a bound (``%s``: the queue, the window twice, the
#: queue, the blocked bound twice): its ready and scheduled deliveries fill the window
#: (then ``retries_hold`` says whether the retries hold it), or its blocked ones their
#: bound (``--burst``: ``group_behind(window=…)``).
AT_BOUND_SQL = f"SELECT {PENDING} >= %s, {BLOCKED} >= %s"


def weighed_from(window: int) -> int:
    """How many retries make the look weigh them (``retries_hold``): half the window. A
    woken member's quick pump takes a group only under this many, leaving the rest to the
    look."""
    return max(window // 2, 1)


class Hold(NamedTuple):
    """What ``retries_hold`` found: ``held`` None when the server's answer was cut short
    (a wake-up's ``KILL QUERY`` landing in a count: look again)."""

    held: bool | None
    #: The group's ready deliveries (up to the window), where its retries don't hold it.
    ready: int = 0


def retries_hold(cursor: Any, queue: str, window: int) -> Hold:
    """Whether the group's retries (half its window or more) hold its pump: its handler
    failing (none of the newest attempts of its queue succeeded), or its retries at their
    own bound. A group name subscribed on two topics has one queue: one window, one
    state."""
    bound = SCHEDULED_WINDOWS * window
    cursor.execute(RETRIES_HOLD_SQL, [queue, bound, bound, queue, RECENT_ATTEMPTS, queue,
                                      window])
    row = cursor.fetchone()
    if row is None or None in row:
        return Hold(None)
    return Hold(bool(row[0]), 0 if row[0] else int(row[1]))
