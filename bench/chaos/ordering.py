"""The order and limit audit: ordered subjects run one at a time in enqueue order, no
concurrency key ever runs more than its limit at once, and no rate key starts more than
its limit in any window, through every fault of the run.

Within a subject the queue gives ids in commit order (its producers serialise on the
subject's gate row), so "enqueue order" is id order. A run cut short by a kill -9 or a
crashing task has no end in the ledger: it ended, at the latest, when its process died.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from . import events as ev
from .config import GATE_LIMIT, RATE_LIMIT, RATE_SLACK, RATE_WINDOW_SECONDS
from .events import Event

if TYPE_CHECKING:  # (facts imports the ledger's models: this module stays importable alone)
    from .facts import MessageFacts, Run


def _death_times(events: list[Event]) -> dict[int, float]:
    """When each worker process that died by a kill -9 or by itself died."""
    return {e.pid: e.at for e in events if e.kind in (ev.KILL, ev.CRASH) and e.pid}


def _end(run: Run, deaths: dict[int, float]) -> float | None:
    return run.end if run.end is not None else deaths.get(run.pid)


def order_violations(messages: list[MessageFacts], events: list[Event]) -> list[dict[str, Any]]:
    """Pairs of consecutive messages of a subject where the later one started before the
    earlier one's last run ended (or started at all before it)."""
    deaths = _death_times(events)
    by_subject: dict[str, list[MessageFacts]] = defaultdict(list)
    for message in messages:
        if message.kind == "ordered" and message.runs:
            by_subject[message.gate_key].append(message)
    found = []
    for subject, chain in by_subject.items():
        chain.sort(key=lambda m: m.id)
        for before, after in itertools.pairwise(chain):
            last = max(before.runs, key=lambda r: r.start)
            last_end = _end(last, deaths)
            first = min(r.start for r in after.runs)
            if first < last.start or (last_end is not None and first < last_end):
                found.append({"subject": subject, "before": before.id, "after": after.id,
                              "before_last_start": last.start, "before_last_end": last_end,
                              "after_first_start": first})
    return found


def limit_peaks(messages: list[MessageFacts], events: list[Event]) -> dict[str, int]:
    """The most runs of each concurrency key that overlapped."""
    deaths = _death_times(events)
    steps: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for message in messages:
        if message.kind != "limited":
            continue
        for run in message.runs:
            end = _end(run, deaths)
            if end is None:
                continue  # a run whose end can't be bounded is left out
            steps[message.gate_key] += [(run.start, 1), (end, -1)]
    peaks = {}
    for key, changes in steps.items():
        running = peak = 0
        for _, change in sorted(changes):  # an end before a start at the same instant
            running += change
            peak = max(peak, running)
        peaks[key] = peak
    return peaks


def rate_peaks(messages: list[MessageFacts],
               window: float = RATE_WINDOW_SECONDS) -> dict[str, int]:
    """The most starts of each rate key in any half-open window of ``window`` seconds.
    Every run counts, a run cut short by a kill -9 too: its claim took a start."""
    starts: dict[str, list[float]] = defaultdict(list)
    for message in messages:
        if message.kind == "rated":
            starts[message.gate_key] += [run.start for run in message.runs]
    peaks = {}
    for key, times in starts.items():
        times.sort()
        most, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= window:
                first += 1
            most = max(most, last - first + 1)
        peaks[key] = most
    return peaks


def audit(messages: list[MessageFacts], events: list[Event]) -> dict[str, Any]:
    violations = order_violations(messages, events)
    peaks = limit_peaks(messages, events)
    over = {key: peak for key, peak in peaks.items() if peak > GATE_LIMIT}
    rates = rate_peaks(messages)
    too_fast = {key: peak for key, peak in rates.items() if peak > RATE_LIMIT + RATE_SLACK}
    return {
        "metrics": {
            "ordered_messages": sum(m.kind == "ordered" for m in messages),
            "order_violations": len(violations),
            "limited_messages": sum(m.kind == "limited" for m in messages),
            "limit_violations": len(over),
            "limit_peak": max(peaks.values(), default=0),
            "rated_messages": sum(m.kind == "rated" for m in messages),
            "rate_violations": len(too_fast),
            "rate_peak": max(rates.values(), default=0),
        },
        "order_violations": violations[:50],
        "limit_peaks": peaks,
        "rate_peaks": rates,
    }
