"""Recovery after kill -9: from the kill to the sweep, and to the orphan's next claim.

An orphan is a claim of the killed process that the queue took back (a ``WorkerLost``
history row of that pid written after the kill). Its next claim is when attempt + 1
began elsewhere: the first later history row's ``started_at`` (the claim time on ``lost``
rows, the start of the run on the others) or the ledger's first later run by another
process, whichever comes first. (A claim that never started spends no attempt, so the
attempt number alone does not find it.)
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING, Any

from . import events as ev
from .events import Event, node_down_during

if TYPE_CHECKING:  # (facts.py reads the ledger's models: the audit is tested without them)
    from .facts import Facts, MessageFacts, Try


@dataclasses.dataclass
class Recovery:
    """Times from each kill -9 to the sweep and to the next claim of each orphan."""

    sweep: list[float] = dataclasses.field(default_factory=list)
    reclaim: list[float] = dataclasses.field(default_factory=list)
    unreclaimed: list[int] = dataclasses.field(default_factory=list)
    #: Orphans whose wait for the sweep overlapped a Galera node kill: left out of the
    #: figures above (the sweeper may have been on that node and its lease had to run
    #: out first; ``node_recovery`` measures that case).
    node_down: int = 0

    def as_dict(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float | None]:
            if not values:
                return {"median": None, "max": None}
            return {"median": round(statistics.median(values), 3),
                    "max": round(max(values), 3)}

        return {"orphans": len(self.reclaim) + len(self.unreclaimed),
                "sweep_seconds": stats(self.sweep), "reclaim_seconds": stats(self.reclaim),
                "unreclaimed": self.unreclaimed, "node_down": self.node_down}


def recovery(facts: Facts, events: list[Event]) -> Recovery:
    result = Recovery()
    kills = {event.pid: event for event in events if event.kind == ev.KILL}
    downs = [event for event in events if event.kind == ev.NODE_KILL]
    for message in facts.messages.values():
        for attempt in message.tries:
            kill = kills.get(attempt.pid) if attempt.pid is not None else None
            if kill is None:
                continue
            if _is_orphan(attempt, kill.at) and node_down_during(downs, kill.at,
                                                                  attempt.finished):
                result.node_down += 1
                continue
            _orphan(result, message, attempt, kill.at)
    return result


def _is_orphan(attempt: Try, killed_at: float) -> bool:
    """A claim its holder lost to a kill at ``killed_at`` (taken back after it, claimed
    before it)."""
    if attempt.error_class != "WorkerLost" or attempt.finished < killed_at:
        return False
    return attempt.started is None or attempt.started <= killed_at


def node_recovery(facts: Facts, events: list[Event],
                  ports_by_pid: dict[int, int | None]) -> Recovery:
    """The same, for the claims of the workers connected to a Galera node killed -9 (their
    processes live on; their claims are lost with their connections, then their leases)."""
    result = Recovery()
    for kill in (event for event in events if event.kind == ev.NODE_KILL):
        for message in facts.messages.values():
            for attempt in message.tries:
                if attempt.pid is not None and ports_by_pid.get(attempt.pid) == kill.port:
                    _orphan(result, message, attempt, kill.at)
    return result


def _orphan(result: Recovery, message: MessageFacts, attempt: Try, killed_at: float) -> None:
    """Count ``attempt`` if it is a claim its holder lost to a kill at ``killed_at``: when
    the sweep took it back, and when it was claimed again elsewhere."""
    if not _is_orphan(attempt, killed_at):
        return  # not taken back after the kill, or claimed after it: not this kill's
    result.sweep.append(attempt.finished - killed_at)
    # The next claim elsewhere: a claim that never started spends no attempt, so the
    # number may be the same; what counts is a claim or run after the kill.
    later = [t.started for t in message.tries
             if t is not attempt and t.started is not None and t.started > killed_at]
    later += [run.start for run in message.runs
              if run.pid != attempt.pid and run.start > killed_at]
    if later:
        result.reclaim.append(min(later) - killed_at)
    else:
        result.unreclaimed.append(message.id)
