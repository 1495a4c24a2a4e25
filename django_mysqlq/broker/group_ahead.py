"""Consumer groups whose position is past their topic's end (changed by hand, or the
topic's row made again from 0): set back by the sequencer before it gives the offsets
after the end, and shown to operators until then.

The sequencer gives the next messages the offsets after the topic's ``last_offset``. A
group at position 10 of a topic whose last offset is 2 would get none of offsets 3 to 10:
its pump reads after its position, so once the topic got past 10 it went on at 11 and
those eight messages, all published after the position was set, never reached it,
without a word (the pump waited, and said so, only while the topic was below 10; a woken
member's pump, which stamps and reads in one transaction, skipped them at once).

So every sequencing round, under the topic's row lock and before it gives an offset,
sets such a group back to the end (the round's lock statement tells whether one is past
it: a plain read of the topic's group rows, no extra statement): every message published
after the position was set reaches the group once, whichever reader gives the offsets
(another group's member, a broadcast reader, the recovery leader); none published before
comes again (what the position had skipped stays skipped), and no waiting delivery is
cancelled, as a reset would. Each is logged at error level. A topic whose counter is below
offsets its messages already have (lowered by hand) has the counter moved past them first,
as its round would on the duplicate offset (``topic_repairs.counter_behind``): a group up
to the highest offset keeps its position, not past what new messages get.

A round that can't take such a group's row (its pump holds it for a moment, or a
stranger) gives no offset: a waiting round waits for the row, a ``SKIP LOCKED`` one stamps
nothing and its caller looks again, as for the topic's own row. Until a round runs (no
reader of the topic is up, nothing is published), ``queuetopic groups``, ``queuestats``,
the dashboard and the admin show the group past the end (``topic_ops.GroupState.past_end``)
with the reset that mends it. A position the topic had already passed (no round ran in
between) can't be told from one the pump moved there: the messages between were skipped.
"""

from __future__ import annotations

from typing import Any

from .base import logger, placeholders
from .topic_repairs import HIGHEST_OFFSET_SQL, counter_behind
from .topictables import TOPIC_TABLE

GROUP_TABLE = "mysqlq_topic_group"
#: For the sequencer's lock statement (``topics.LOCK_TOPIC_SQL``, the topic's row as
#: ``t``): whether a group of the topic is past its last offset (a plain read along the
#: groups' unique index).
ANY_PAST_END = (f"EXISTS(SELECT 1 FROM {GROUP_TABLE} g WHERE g.topic = t.name AND "
                "g.position > t.last_offset)")
#: The topic's groups past an end (a plain read: the rows are then locked by id, so that
#: a waiting round waits only for those).
PAST_END_SQL = f"SELECT id FROM {GROUP_TABLE} WHERE topic = %s AND position > %s"
#: Those rows locked (``{ids}``), as they are now.
LOCK_GROUPS_SQL = (f"SELECT id, group_name, position FROM {GROUP_TABLE} WHERE id IN ({{ids}})"
                   " FOR UPDATE")
LOCK_GROUPS_SKIP_SQL = f"{LOCK_GROUPS_SQL} SKIP LOCKED"
#: The counter moved up to the highest offset given out (as a round's stamp would).
COUNTER_UP_SQL = f"UPDATE {TOPIC_TABLE} SET last_offset = %s WHERE name = %s"
#: The positions set back to the end (``{ids}``; a note of a pump problem ends with it).
SET_BACK_SQL = (f"UPDATE {GROUP_TABLE} SET position = %s, pump_problem = '', "
                "pump_problem_at = NULL WHERE id IN ({ids})")


def reset_hint(topic: str, group: str, end: int) -> str:
    """The command that puts a group past the end back where no round does."""
    return f"manage.py queuetopic reset {group} --topic {topic} --to-offset {end + 1}"


def set_back_past_end(cursor: Any, topic: str, last: int, skip_locked: bool) -> int | None:
    """In a sequencing round, under the topic's row lock (its last offset ``last``), once
    its lock statement found a group past the end: set such groups back to the end, the
    counter moved first past offsets its messages have (see the module's note). Returns
    the last offset to stamp after; None when ``skip_locked`` found one of those groups'
    rows held (or gone): no offset may be given this round."""
    cursor.execute(HIGHEST_OFFSET_SQL, [topic])
    if int(cursor.fetchone()[0] or 0) > last:
        last = counter_behind(cursor, topic, last)
        cursor.execute(COUNTER_UP_SQL, [last, topic])
    cursor.execute(PAST_END_SQL, [topic, last])
    ids = [int(row[0]) for row in cursor.fetchall()]
    if not ids:
        return last
    cursor.execute((LOCK_GROUPS_SKIP_SQL if skip_locked else LOCK_GROUPS_SQL).format(
        ids=placeholders(len(ids))), ids)
    rows = cursor.fetchall()
    if skip_locked and len(rows) < len(ids):
        return None
    back = [(int(row[0]), str(row[1]), int(row[2])) for row in rows if int(row[2]) > last]
    if back:
        cursor.execute(SET_BACK_SQL.format(ids=placeholders(len(back))),
                       [last, *(group_id for group_id, _, _ in back)])
    for _, group, position in back:
        logger.error(
            "Group %r of topic %r was at position %d, past the topic's last offset %d "
            "(changed by hand?): the next messages published get offsets %d to %d, and the "
            "group would have skipped them. Its position is set back to %d: it gets every "
            "message published from now on, once; none published before comes again and no "
            "waiting delivery was cancelled. To skip messages, reset the group (manage.py "
            "queuetopic reset); never set a position past the last offset.",
            group, topic, position, last, last + 1, position, last)
    return last
