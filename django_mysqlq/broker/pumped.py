"""What a group's pump did (:class:`Pumped`), and whether a group's row is free.

A pump takes its group's row ``FOR UPDATE SKIP LOCKED``: another member pumping holds it
for milliseconds, and the pump leaves the round to it. A stranger's transaction left open
on the row holds it for as long as it stays open, and the group gets nothing meanwhile:
the pump says so (``group_held``) rather than answer as if there were nothing to do, and
the worker logs a hold that lasts (``worker/group_holds.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import default_alias, in_transaction
from .oversized import Oversized
from .topictables import GROUP_TABLE

#: Whether the group's row can be taken now (the pump's lock, skipped while held).
PROBE_GROUP_SQL = (f"SELECT id FROM {GROUP_TABLE} WHERE topic = %s AND group_name = %s"
                   " FOR UPDATE SKIP LOCKED")


@dataclasses.dataclass(frozen=True)
class Pumped:
    """What :func:`.deliveries.pump_group` did (compared without ``group_lock``: what it
    did, not how it went about it)."""

    #: Deliveries made.
    made: int
    #: The group was behind its topic's last offset (False: it had every sequenced
    #: message; only sequencing gives it more).
    behind: bool
    #: Another caller held the topic's sequencing lock: look again shortly (its commit
    #: wakes nobody).
    busy: bool = False
    #: The group stopped before this message: its delivery would not fit in a statement.
    oversized: Oversized | None = None
    #: The look found the group's position past its topic's last offset (changed by
    #: hand): (position, last offset). A sequencing round then set it back (``group_ahead``).
    ahead: tuple[int, int] | None = None
    #: The group's row carries a note of a pump problem (``topic_problems``): one that
    #: has every sequenced message clears it (``clear_pump_problem``), since a hand fix
    #: that left nothing to pump is not followed by a move of the position.
    noted: bool = False
    #: The pump's lock on the group's row: True taken, False held by another session
    #: (another member's pump, or a stranger: nothing was pumped), None not tried (the
    #: look found nothing to do).
    group_lock: bool | None = dataclasses.field(default=None, compare=False)


def group_row_free(topic: str, group: str, alias: str | None = None) -> bool:
    """Whether the group's row can be taken now (a transaction that takes it ``SKIP
    LOCKED`` and ends at once): for a member that saw it held and whose look has
    nothing to pump, to tell when it is free again."""

    def probe(cursor: Any) -> bool:
        cursor.execute(PROBE_GROUP_SQL, [topic, group])
        return cursor.fetchone() is not None

    return bool(in_transaction(alias or default_alias(), probe))
