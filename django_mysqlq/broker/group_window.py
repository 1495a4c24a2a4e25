"""The bounds of a consumer group's pump: what a group may keep in the queue table.

The window (``TOPIC_WINDOW``) counts the group's deliveries waiting to run: ready ones,
and its retries (``scheduled``) while its handler is failing: none of its deliveries
succeeded in the last :data:`RETRY_HOLD_SECONDS`, so a group whose every delivery fails
fast keeps its backlog in the topic instead of copying it into ``mysqlq_message`` as
retries. A group whose handler works stays unheld by its retries (a few messages failing
for hours must not stop the rest) up to :data:`SCHEDULED_WINDOWS` windows of them; its
blocked deliveries (behind a hot key, or one held by a dead delivery) stop it at
:data:`BLOCKED_WINDOWS` windows. Counting retries past the window costs a longer read of
the claim index, so it is done only when they fill half of it (``retries_hold``).
"""

from __future__ import annotations

from typing import Any

from ..models import CLAIM_INDEX
from .base import ATTEMPT_TABLE, MESSAGE_TABLE

#: A group's blocked deliveries (keyed ones behind their key's earlier delivery: a hot key,
#: or one held by a dead delivery with ``on_dead="hold"``) stop its pump at this many
#: windows: other keys go on past one held key for a while, and the rows stay bounded.
BLOCKED_WINDOWS = 10
#: A group's retries stop its pump at this many windows even while its handler works
#: (most of its deliveries failing, but not all).
SCHEDULED_WINDOWS = 10
#: A group none of whose deliveries succeeded this long counts its retries in its window.
RETRY_HOLD_SECONDS = 60.0
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
#: delivery task, the seconds in microseconds): as many as their own bound, or none of its
#: deliveries succeeded lately (the history's rows of its task in those seconds); then
#: its ready deliveries up to the window (``%s``: the queue, the window), the window's
#: count when the retries don't.
RETRIES_HOLD_SQL = (
    f"SELECT {SCHEDULED} >= %s OR NOT EXISTS(SELECT 1 FROM {ATTEMPT_TABLE} FORCE INDEX "
    "(mysqlq_att_task) WHERE task_name = %s AND finished_at >= UTC_TIMESTAMP(6) - INTERVAL "
    f"%s MICROSECOND AND outcome = 'succeeded'), {READY}"
)
#: Whether the group's pump waits at a bound (``%s``: the queue, the window twice, the
#: queue, the blocked bound twice): its ready and scheduled deliveries fill the window
#: (then ``retries_hold`` says whether the retries hold it), or its blocked ones their
#: bound (``--burst``: ``group_behind(window=…)``).
AT_BOUND_SQL = f"SELECT {PENDING} >= %s, {BLOCKED} >= %s"


def retries_hold(cursor: Any, queue: str, task_name: str, window: int) -> int | None:
    """None when the group's retries hold its pump (its handler failing lately, or its
    retries at their own bound), else its ready deliveries (up to ``window``): all its
    window counts then. A NULL from the server (a wake-up's ``KILL QUERY`` cutting a count
    short) holds it: the member looks again."""
    bound = SCHEDULED_WINDOWS * window
    cursor.execute(RETRIES_HOLD_SQL, [queue, bound, bound, task_name,
                                      int(RETRY_HOLD_SECONDS * 1_000_000), queue, window])
    row = cursor.fetchone()
    if row is None or None in row or row[0]:
        return None
    return int(row[1])
