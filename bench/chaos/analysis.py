"""The verdict: every count and check of a run, from the facts and the events."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from . import claims, ordering
from . import events as ev
from .duplicates import cause_of, describe
from .events import Event
from .facts import Facts, MessageFacts
from .recovery import node_recovery, recovery

CHECKS = (
    ("lost", "messages gone from the queue without a success"),
    ("unexplained_duplicates", "messages run twice with no kill, KILL or restart to explain it"),
    ("atomic_violations", "atomic messages whose business rows are not exactly one per "
                          "success (zero otherwise)"),
    ("stray_effects", "business rows of no committed atomic message"),
    ("acked_without_run", "messages acked whose task never ran to its end"),
    ("phantom_runs", "runs of messages no committed transaction enqueued"),
    ("still_queued", "messages still queued after the drain (stuck?)"),
    ("unexplained_claim_losses", "claims taken back from a live, connected worker, or left "
                                 "behind by a graceful stop"),
    ("stalled_claims", "claims a worker held, never started, for longer than a lease"),
    ("dead", "messages dead although no task ever raises by itself (the crashing task's "
             "aside)"),
    ("crashing_tasks_not_dead", "messages of the crashing task not dead at the end: it must "
                                "spend its own attempts, then die"),
    ("unexplained_crashes", "workers that exited without being told to, and not by running "
                            "the crashing task"),
    ("stalled_locks", "windows with a waiting row locked by the harness in which no other "
                      "message finished: the lock held the queue up"),
    ("unclean_stops", "SIGTERMed workers that did not stop cleanly"),
    ("order_violations", "messages of an ordered subject that started before the one enqueued "
                         "before them had ended"),
    ("limit_violations", "concurrency keys that ran more messages at once than their limit"),
    ("rate_violations", "rate keys that started more messages in a window than their limit "
                        "(and the audit's slack) allow"),
)


def _shape(message: str) -> str:
    return re.sub(r"\d+", "N", message)


def _ids(messages: list[MessageFacts], status: str) -> list[int]:
    return [m.id for m in messages if m.status == status]


def _resume_after_restarts(messages: list[MessageFacts], events: list[Event]) -> list[float]:
    """Seconds from each restart's end (a node's return to the cluster) to the first
    success after it."""
    resume = []
    for restart in (e for e in events if e.kind in ev.OUTAGES):
        back = restart.until or restart.at
        after = [t.finished for m in messages for t in m.tries
                 if t.outcome == "succeeded" and t.finished > back]
        if after:
            resume.append(round(min(after) - back, 3))
    return resume


def _crash_pids(messages: list[MessageFacts]) -> set[int]:
    """Worker processes that ran the crashing task (and so went down by it)."""
    return {run.pid for m in messages if m.kind == "crash" for run in m.runs}


def _stalled_locks(messages: list[MessageFacts], events: list[Event]) -> list[dict[str, Any]]:
    """Locked-row windows (no restart among them) in which no other message succeeded."""
    restarts = [e for e in events if e.kind in ev.OUTAGES]
    stalled = []
    for lock in (e for e in events if e.kind == ev.LOCKED_ROW):
        start, end = lock.at, lock.until or lock.at
        if end - start < 2 or any(r.at <= end and (r.until or r.at) >= start
                                  for r in restarts):
            continue
        done = sum(1 for m in messages for t in m.tries
                   if t.outcome == "succeeded" and start <= t.finished <= end)
        if not done:
            stalled.append({"from": start, "until": end, "detail": lock.detail})
    return stalled


def analyze(facts: Facts, events: list[Event], rolled_back: set[str], limit: float,
            lease: float, ports_by_pid: dict[int, int | None] | None = None) -> dict[str, Any]:
    everything = list(facts.messages.values())
    crashing = [m for m in everything if m.kind == "crash"]
    messages = [m for m in everything if m.kind != "crash"]
    crash_pids = _crash_pids(crashing)
    crashes = [e for e in events if e.kind == ev.CRASH]
    stalled_locks = _stalled_locks(everything, events)
    duplicates = [m for m in messages if len(m.runs) > 1]
    causes = Counter(cause_of(m, events) or "unexplained" for m in duplicates)
    unexplained = [describe(m, events) for m in duplicates if cause_of(m, events) is None]
    atomic_bad = [m.id for m in messages if m.kind == "atomic"
                  and m.effects != (1 if m.status == "succeeded" else 0)]
    acked_unrun = [m.id for m in messages if m.status == "succeeded" and not m.executed]
    rec = recovery(facts, events).as_dict()
    node_rec = node_recovery(facts, events, ports_by_pid or {}).as_dict()
    taken = claims.judge(facts, events, lease)
    kinds = Counter(event.kind for event in events)
    unclean = [e for e in events if e.kind in (ev.STOP_OVERRUN, ev.STOP_STATUS)]
    node_down_stops = [e for e in unclean if ev.node_down_while_stopping(e, events)]
    tries = [t for m in messages for t in m.tries]
    gates = ordering.audit(messages, events)
    metrics = {
        "enqueued": len(messages),
        "executed": sum(m.executed for m in messages),
        "succeeded": len(_ids(messages, "succeeded")),
        "duplicates": len(duplicates),
        "unexplained_duplicates": len(unexplained),
        "lost": len(_ids(messages, "lost")),
        "dead": len(_ids(messages, "dead")),
        "still_queued": len(_ids(messages, "queued")),
        "atomic_messages": sum(m.kind == "atomic" for m in messages),
        "atomic_violations": len(atomic_bad),
        "stray_effects": facts.stray_effects,
        "acked_without_run": len(acked_unrun),
        "phantom_runs": sum(len(runs) for runs in facts.phantoms.values()),
        "rolled_back_that_ran": len(rolled_back & set(facts.phantoms)),
        "late_ack_rows": sum(sum(t.outcome == "succeeded" for t in m.tries) > 1
                             for m in messages),
        "unexplained_claim_losses": len(taken["unexplained"]),
        "stalled_claims": len(taken["stalled"]),
        "longest_stall_seconds": taken["longest_stall"],
        "kills": kinds[ev.KILL],
        "sigterms": kinds[ev.SIGTERM],
        "connection_kills": kinds[ev.CONNECTION_KILL],
        "restarts": kinds[ev.RESTART],
        "node_kills": kinds[ev.NODE_KILL],
        "crashes": kinds[ev.CRASH],
        "unexplained_crashes": sum(e.pid not in crash_pids for e in crashes),
        "crashing_tasks": len(crashing),
        "crashing_tasks_not_dead": sum(m.status != "dead" for m in crashing),
        "locked_rows": kinds[ev.LOCKED_ROW],
        "stalled_locks": len(stalled_locks),
        "unclean_stops": len(unclean) - len(node_down_stops),
        "unclean_stops_node_down": len(node_down_stops),
        "stopped_starting": kinds[ev.STOPPED_STARTING],
        "recovery_median_seconds": rec["reclaim_seconds"]["median"],
        "recovery_max_seconds": rec["reclaim_seconds"]["max"],
        "kill_orphans_node_down": rec["node_down"],
        "node_kill_orphans": node_rec["orphans"],
        "node_recovery_median_seconds": node_rec["reclaim_seconds"]["median"],
        "node_recovery_max_seconds": node_rec["reclaim_seconds"]["max"],
        "node_down_seconds": [round((e.until or e.at) - e.at, 1) for e in events
                              if e.kind == ev.NODE_KILL],
        **gates["metrics"],
    }
    failures = _failures(metrics, limit)
    return {
        "ok": not failures,
        "failures": failures,
        "metrics": metrics,
        "duplicate_causes": dict(causes),
        "unexplained": unexplained[:50],
        "unexplained_claim_losses": taken["unexplained"][:50],
        "stalled_claims": taken["stalled"][:50],
        "stalled_locks": stalled_locks,
        "crashing_task_histories": [[t.outcome for t in m.tries] for m in crashing][:20],
        "recovery": rec,
        "node_recovery": node_rec,
        "restart_resume_seconds": _resume_after_restarts(messages, events),
        "history_outcomes": facts.outcomes,
        "lost_reasons": dict(Counter(_shape(t.error_message) for t in tries
                                     if t.error_class == "WorkerLost").most_common()),
        "retried_errors": dict(Counter(t.error_class for t in tries
                                       if t.outcome == "retried").most_common()),
        "lost_ids": _ids(messages, "lost")[:100],
        "still_queued_ids": _ids(messages, "queued")[:100],
        "dead_ids": _ids(messages, "dead")[:100],
        "atomic_violation_ids": atomic_bad[:100],
        "acked_without_run_ids": acked_unrun[:100],
        "phantom_tokens": sorted(facts.phantoms)[:100],
        "order_violations": gates["order_violations"],
        "limit_peaks": gates["limit_peaks"],
        "rate_peaks": gates["rate_peaks"],
    }


def _failures(metrics: dict[str, Any], limit: float) -> list[str]:
    failures = [f"{key} = {metrics[key]}: {what}" for key, what in CHECKS if metrics[key]]
    median = metrics["recovery_median_seconds"]
    if median is not None and median > limit:
        failures.append(f"recovery_median_seconds = {median} > {limit}: kill -9 orphans wait "
                        "too long to be claimed again")
    return failures
