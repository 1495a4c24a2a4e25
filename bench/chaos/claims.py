"""Claims the queue took back from their workers (``lost`` history rows), judged.

* *Unexplained*: no kill -9, KILL CONNECTION, crash or restart touched the claiming
  worker between the claim and its recovery: a live, connected worker lost it, or a
  graceful stop (SIGTERM), which releases what it holds, left it behind.
* *Stalled*: a claim its worker never started and held for longer than a lease before
  the queue took it back (no restart in between): the message waited for nothing.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .events import Event
from .facts import Facts, MessageFacts, Try

SLACK = 0.5
#: Events that may take a claim away from a worker.
TAKERS = (ev.KILL, ev.CONNECTION_KILL, ev.CRASH, ev.STOP_OVERRUN)


def _explained(held: Try, events: list[Event]) -> bool:
    first = (held.started if held.started is not None else held.finished) - SLACK
    last = held.finished + SLACK
    for event in events:
        if event.kind in ev.OUTAGES and event.at <= last and (event.until or event.at) >= first:
            return True
        if event.kind in TAKERS and event.pid == held.pid and first <= event.at <= last:
            return True
    return False


def _started(message: MessageFacts, held: Try) -> bool:
    return any(run.attempt == held.attempt and run.pid == held.pid for run in message.runs)


def _restart_between(held: Try, events: list[Event]) -> bool:
    first = held.started if held.started is not None else held.finished
    return any(event.kind in ev.OUTAGES and event.at <= held.finished
               and (event.until or event.at) >= first for event in events)


def _evidence(message: MessageFacts, held: Try, events: list[Event]) -> dict[str, Any]:
    first = held.started if held.started is not None else held.finished
    around = [f"{event.kind} {event.at - first:+.2f}s" for event in events
              if (event.pid == held.pid or event.kind in ev.OUTAGES)
              and first - 10 <= event.at <= held.finished + 10]
    return {"message_id": message.id, "attempt": held.attempt, "pid": held.pid,
            "claimed": held.started, "recovered": held.finished,
            "held_seconds": None if held.started is None
            else round(held.finished - held.started, 3),
            "reason": held.error_message, "started_by_claimer": _started(message, held),
            "next_runs": [{"pid": r.pid, "attempt": r.attempt, "start": round(r.start, 3)}
                          for r in message.runs if r.attempt > held.attempt][:3],
            "holder_events_relative_to_claim": around}


def judge(facts: Facts, events: list[Event], lease: float) -> dict[str, Any]:
    unexplained: list[dict[str, Any]] = []
    stalled: list[dict[str, Any]] = []
    for message in facts.messages.values():
        for held in message.tries:
            if held.error_class != "WorkerLost":
                continue
            if not _explained(held, events):
                unexplained.append(_evidence(message, held, events))
            if (held.started is not None and held.finished - held.started > lease + 2
                    and not _started(message, held) and not _restart_between(held, events)):
                stalled.append(_evidence(message, held, events))
    longest = max((item["held_seconds"] or 0.0 for item in stalled), default=None)
    return {"unexplained": unexplained, "stalled": stalled, "longest_stall": longest}
