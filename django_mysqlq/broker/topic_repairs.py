"""What a sequencing round does about topic rows changed by hand: offsets cleared (given
again, and said), a counter below the offsets given out (moved past them, and said)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError

from .base import aware_utc, logger
from .topictables import OFFSET_INDEX, TOPIC_MESSAGE_TABLE

#: Which of the ids a round is about to stamp were sequenced before (an offset cleared by
#: hand keeps its ``sequenced_at``), by primary key: after the sorted read only.
SEQUENCED_BEFORE_SQL = (f"SELECT id, sequenced_at FROM {TOPIC_MESSAGE_TABLE} "
                        "WHERE id IN ({ids}) AND sequenced_at IS NOT NULL ORDER BY id")
#: Messages a round's error names one by one (the others are counted).
NAMED_AGAIN = 10
#: The highest offset a message of the topic has (one dive into the offset index).
HIGHEST_OFFSET_SQL = (f"SELECT MAX(msg_offset) FROM {TOPIC_MESSAGE_TABLE} "
                      f"FORCE INDEX ({OFFSET_INDEX}) WHERE topic = %s")
#: A duplicate key: here, an offset a message already has.
DUPLICATE_KEY = 1062


def sequenced_before(cursor: Any, ids: Sequence[int]) -> list[tuple[int, dt.datetime]]:
    """Of ``ids`` (rows without an offset), those that had one: ``(id, sequenced_at)``."""
    cursor.execute(SEQUENCED_BEFORE_SQL.format(ids=", ".join(["%s"] * len(ids))), list(ids))
    return [(int(row[0]), aware_utc(row[1]) or row[1]) for row in cursor.fetchall()]


def log_sequenced_again(topic: str, again: Sequence[tuple[int, dt.datetime]],
                         offsets: dict[int, int]) -> None:
    """Say, once per round, that messages sequenced before were stamped again.

    Their offset was set back to NULL by hand (``sequenced_at`` stays). The round stamps
    them again rather than leave them out: the old offset is gone (a gap every reader
    skips), so a message left without one would never reach a group that had not read
    that far, and it would head every round's read for good. Stamped again, nothing is
    lost; each group gets it at its new offset, a second time for a group that had read
    past the old one (at least once holds; out of its key's order). Logged at error
    level with what the operator should have done instead.
    """
    named = ", ".join(f"id {message_id} (sequenced {when.isoformat()}, now offset "
                      f"{offsets[message_id]})" for message_id, when in again[:NAMED_AGAIN])
    if len(again) > NAMED_AGAIN:
        named += f" and {len(again) - NAMED_AGAIN} more"
    logger.error(
        "Topic %r: %d message(s) sequenced before had no offset (msg_offset set back to NULL "
        "by hand?): %s. They were given new offsets, so every consumer group and broadcast "
        "reader gets them again, at the new offsets: a second time where they were read "
        "before (duplicates; out of order for their key); nothing is lost, and their old "
        "offsets are gaps every reader skips. Don't clear an offset to deliver a message "
        "again: `manage.py queuetopic replay --topic %s --group <group> --from-offset "
        "<offset> --to-offset <offset>` delivers a range again to one group, and "
        "`manage.py queuetopic reset <group> --topic %s --to-offset <offset>` moves a group "
        "back.", topic, len(again), named, topic, topic)


def counter_behind(cursor: Any, topic: str, last: int) -> int:
    """The topic's ``last_offset`` is below an offset a message has (changed by hand: the
    counter lowered, or a message's offset raised), so the next ones would be refused by
    the unique index in every round: go on after the highest one (the round's stamp is
    its statement alone, undone by the server; the transaction goes on). Logged: it
    happens once, the round moves the counter."""
    cursor.execute(HIGHEST_OFFSET_SQL, [topic])
    highest = int(cursor.fetchone()[0] or 0)
    if highest <= last:  # (not the counter's doing: let the error be seen)
        raise IntegrityError(f"Topic {topic!r}: a duplicate offset, though its last_offset "
                             f"({last}) is the highest given out.")
    logger.error(
        "Topic %r: its last_offset (%d) is below offsets its messages already have (offsets "
        "up to %d; changed by hand?), so the next offsets would have been given twice. "
        "New messages get offsets after %d; no message was changed. Groups at positions "
        "between keep theirs (they read on in offset order): check `queuetopic groups`.",
        topic, last, highest, highest)
    return highest
