"""Messages whose task body started more than once, and what explains each.

A duplicate is *explained* when something the harness did could have cut a run short
while the message was held: a ``kill -9`` or ``KILL CONNECTION`` of a worker that claimed
or ran it, or a server restart (on a cluster, a node's kill -9), between the message's first claim
and its last start.
A graceful SIGTERM explains nothing: a stopping worker finishes what it runs and
releases the rest.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .events import Event
from .facts import MessageFacts

#: Tolerance on times compared across processes (clock reads a little apart).
SLACK = 0.5
#: Causes in the order they are credited when several fit.
CAUSES = (ev.KILL, ev.CONNECTION_KILL, ev.RESTART, ev.NODE_KILL, ev.STOP_OVERRUN, ev.CRASH)


def _window(message: MessageFacts) -> tuple[float, float]:
    starts = [run.start for run in message.runs]
    claimed = [t.started for t in message.tries if t.started is not None]
    return min(starts + claimed) - SLACK, max(starts) + SLACK


def _pids(message: MessageFacts) -> set[int]:
    return {run.pid for run in message.runs} | {t.pid for t in message.tries if t.pid}


def cause_of(message: MessageFacts, events: list[Event]) -> str | None:
    """The harness event that explains a duplicate, or None."""
    first, last = _window(message)
    pids = _pids(message)
    fitting = set()
    for event in events:
        if event.kind in ev.OUTAGES:
            if event.at <= last and (event.until or event.at) >= first:
                fitting.add(event.kind)
        elif event.pid in pids and first <= event.at <= last:
            fitting.add(event.kind)
    return next((cause for cause in CAUSES if cause in fitting), None)


def describe(message: MessageFacts, events: list[Event]) -> dict[str, Any]:
    """A duplicate's evidence: runs, history rows and the events around it."""
    first, last = _window(message)
    pids = _pids(message)
    return {
        "message_id": message.id, "kind": message.kind, "status": message.status,
        "runs": [{"pid": r.pid, "attempt": r.attempt, "start": round(r.start, 3),
                  "end": None if r.end is None else round(r.end, 3)} for r in message.runs],
        "history": [{"attempt": t.attempt, "outcome": t.outcome, "pid": t.pid,
                     "started": None if t.started is None else round(t.started, 3),
                     "finished": round(t.finished, 3), "error": t.error_message[:200]}
                    for t in message.tries],
        "events_nearby": [e.as_dict() for e in events
                          if first - 5 <= e.at <= last + 5
                          and (e.pid is None or e.pid in pids)],
    }
