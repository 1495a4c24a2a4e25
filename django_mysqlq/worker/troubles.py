"""What keeps failing in a worker now, as one text for its row (``mysqlq_worker.troubles``).

Each lasting failure is logged once (``log.Failures``). An operator who was not reading
the log then sees it beside the worker in ``queuestats``, the dashboard and the admin,
from the worker's next heartbeat until it works again: an upkeep step, a broadcast
topic's read, a consumer group's pump, the leader's sequencing of a topic nobody reads
and its retention of a topic, the rate keys' table held by a stranger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..broker.park import RATE_TABLE
from ..limits import storable
from ..log import Failures
from . import topic_retention

if TYPE_CHECKING:
    from .topics import TopicDuty
    from .upkeep import Housekeeping, RateWatch

#: Longest text written on the row; the lines past it are counted, not written.
TROUBLES_MAX_CHARS = 4000

#: What names a failing thing in a line (from its key), and its failures.
Source = tuple[Callable[[Any], str], Failures[Any]]


def now(housekeeping: Housekeeping, topics: TopicDuty, rates: RateWatch | None = None
        ) -> str:
    """The worker's troubles now: one line each, oldest first within each kind (a rate
    table held by a stranger last: its throttled messages wait meanwhile)."""
    sources: list[Source] = [
        (lambda step: f"upkeep step {step!r}", housekeeping.failing),
        (lambda name: f"the pump of group {name[1]!r} of topic {name[0]!r}",
         topics.trouble.failing),
        (lambda topic: f"offsets for topic {topic!r} (no reader; the recovery leader's)",
         topic_retention.failing),
        (lambda topic: f"retention of topic {topic!r} (the recovery leader's)",
         topic_retention.pruning),
    ]
    if topics.reader is not None:
        sources.append((lambda topic: f"the broadcast read of topic {topic!r}",
                        topics.reader.failing))
    found = episode_lines(sources)
    if rates is not None and rates.locked_since is not None:
        found.append(f"{RATE_TABLE} locked by another session since "
                     f"{rates.locked_since:%Y-%m-%d %H:%M:%S} UTC: throttled messages wait")
    return fit(found)


def episode_lines(sources: Iterable[Source]) -> list[str]:
    """One line per thing failing in ``sources``: what, since when, the latest error."""
    return [f"{name(episode.key)} failing since {episode.since:%Y-%m-%d %H:%M:%S} UTC: "
            f"{episode.error}" for name, failures in sources
            for episode in failures.episodes()]


def fit(lines: Sequence[str], limit: int = TROUBLES_MAX_CHARS) -> str:
    """``lines`` joined, as many as fit in ``limit`` characters with a last line counting
    the others. A line the column can't store as it is (a lone surrogate in an error's
    text) is escaped: the heartbeat that writes it must not fail on it."""
    kept: list[str] = []
    size = 0
    for index, line in enumerate(storable(line) for line in lines):
        if size + len(line) > limit - 60:
            kept.append(f"… and {len(lines) - index} more (the worker's log has them)")
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept)
