"""The broadcast audit: every worker process that lived through a message's whole window
heard it, once; none heard one sequenced before it was even started.

A process *owes* a message when both hold:

* the message was sequenced after the process's start line (it took its position, the
  topic's last offset then, before that line: everything later is after its position);
  a message sequenced between the spawn and that line is *excused at start*;
* the process lived on for ``GRACE`` seconds after the message was sequenced, that
  window stretched past every server outage overlapping it (plus ``GRACE`` again after
  the outage: nobody reads while the server is down). A process that ended (SIGTERM,
  kill -9, a crash) inside that window is *excused at its end*: it may have been killed
  before it would have read the message.

KILL CONNECTION excuses nothing: the reader keeps its position in memory and reads on
with a new connection.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING, Any

from . import events as ev
from .events import Event

if TYPE_CHECKING:  # (lifetimes imports the worker pool: this module stays importable alone)
    from .lifetimes import Lifetime

@dataclasses.dataclass(frozen=True)
class Sequenced:
    offset: int
    #: When the sequencer stamped it (host epoch seconds): from then on a reader sees it.
    at: float


#: Seconds a live reader may take to read a sequenced message (it polls every 0.2 s).
GRACE = 3.0


def _deadline(at: float, outages: list[Event]) -> float:
    deadline = at + GRACE
    for outage in outages:  # in time order
        if outage.at <= deadline and (outage.until or outage.at) >= at:
            deadline = max(deadline, (outage.until or outage.at) + GRACE)
    return deadline


def audit(lives: list[Lifetime], sequenced: dict[str, Sequenced],
          heard: dict[tuple[int, str], int], events: list[Event]) -> dict[str, Any]:
    outages = sorted((e for e in events if e.kind in ev.OUTAGES), key=lambda e: e.at)
    deadlines = {token: _deadline(s.at, outages) for token, s in sequenced.items()}
    counts: Counter[str] = Counter()
    missed: list[dict[str, Any]] = []
    early: list[dict[str, Any]] = []
    for life in lives:
        for token, message in sequenced.items():
            got = (life.pid, token) in heard
            if got and message.at < life.spawned:
                early.append({"pid": life.pid, "offset": message.offset,
                              "sequenced": message.at, "spawned": life.spawned})
            if message.at < life.spawned or (life.ended is not None
                                              and message.at >= life.ended):
                continue  # not alive then: nothing owed, nothing excused
            if life.ready is None or message.at <= life.ready:
                counts["excused_start"] += 1
                continue
            if life.ended is not None and deadlines[token] >= life.ended:
                counts["excused_end"] += 1
                counts["excused_end_heard"] += got
                continue
            counts["owed"] += 1
            if got:
                counts["heard_owed"] += 1
            else:
                missed.append({"pid": life.pid, "offset": message.offset,
                               "sequenced": round(message.at, 3), "ready": life.ready,
                               "ended": life.ended})
    duplicates = sum(count - 1 for count in heard.values() if count > 1)
    return {
        "metrics": {
            "broadcast_processes": sum(life.ready is not None for life in lives),
            "broadcast_owed": counts["owed"],
            "broadcast_heard": counts["heard_owed"],
            "broadcast_missed": len(missed),
            "broadcast_excused_start": counts["excused_start"],
            "broadcast_excused_end": counts["excused_end"],
            "broadcast_excused_end_heard": counts["excused_end_heard"],
            "broadcast_before_start": len(early),
            "broadcast_duplicates": duplicates,
        },
        "broadcast_missed": missed[:50],
        "broadcast_before_start": early[:50],
    }
