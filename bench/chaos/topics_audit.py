"""The topic's verdict: each consumer group handled each committed message (none lost,
none of a rolled-back transaction), duplicates only where a fault explains them (counted
by cause, like the tasks'), key order kept within each group, positions caught up, and
broadcast heard by every process that lived through a message's window.

A *duplicate* is a (group, message) whose handler ran more than once other than to fail
on purpose: two successes, or a run cut short (a kill -9, a crash) and run again. Each
delivery is a queue message, so the tasks' tools judge it: :func:`duplicates.cause_of`
explains it by the events on its claims and runs, :func:`claims.judge` its lost claims,
:func:`ordering.order_violations` the key order (a delivery's runs all count there, the
failed ones too: a key's next message waits for the retries of the one before it).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from . import broadcast, claims, ordering
from .duplicates import cause_of, describe
from .events import Event
from .facts import Facts, MessageFacts
from .lifetimes import Lifetime
from .recovery import recovery
from .streamfacts import StreamFacts

CHECKS = (
    ("topic_lost", "(group, message) pairs of a committed publish with no successful run"),
    ("topic_unsequenced", "topic messages still without an offset at the end"),
    ("topic_rolled_back_seen", "messages of rolled-back transactions sequenced, handled or "
                               "heard"),
    ("topic_phantoms", "handler runs of messages no committed transaction published"),
    ("topic_double_deliveries", "(group, offset) pairs turned into more than one delivery"),
    ("topic_unexplained_duplicates", "(group, message) pairs handled twice with no kill -9, "
                                     "KILL CONNECTION, restart or crash to explain it"),
    ("topic_dead", "deliveries dead (40 attempts: failures on purpose never exhaust them)"),
    ("topic_still_queued", "deliveries still queued after the drain"),
    ("topic_positions_behind", "groups whose position is not the topic's last offset"),
    ("topic_order_violations", "keyed messages a group started before the one sequenced "
                               "before them (same key) had ended"),
    ("topic_unexplained_claim_losses", "delivery claims taken back from a live, connected "
                                       "worker"),
    ("broadcast_missed", "(process, message) pairs owed and never heard"),
    ("broadcast_before_start", "messages heard by a process started after they were "
                               "sequenced (it must begin at the latest offset)"),
    ("broadcast_duplicates", "messages heard twice by one process"),
)


def _redone(message: MessageFacts) -> MessageFacts:
    """The delivery with its failures on purpose left out: what is left ran more than
    once only by accident."""
    return dataclasses.replace(message, runs=[r for r in message.runs
                                              if getattr(r, "outcome", "") != "failed"])


def _order(deliveries: list[MessageFacts], events: list[Event]) -> list[dict[str, Any]]:
    """Key order of one group: its keyed deliveries as ordered messages, by offset."""
    keyed = [dataclasses.replace(m, kind="ordered") for m in deliveries
             if m.gate_key and m.runs]
    return ordering.order_violations(keyed, events)


def analyze(facts: StreamFacts, events: list[Event], rolled_back: set[str],
            lives: list[Lifetime], lease: float) -> dict[str, Any]:
    published = set(facts.published)
    by_group: dict[str, dict[str, Any]] = {}
    causes: Counter[str] = Counter()
    unexplained: list[dict[str, Any]] = []
    order: list[dict[str, Any]] = []
    everything: dict[int, MessageFacts] = {}
    handled = {token for (_, token) in facts.runs}
    for group, deliveries in sorted(facts.deliveries.items()):
        everything.update((m.id, m) for m in deliveries)
        ok = {token for (g, token), runs in facts.runs.items() if g == group
              and any(run.outcome == "ok" for run in runs)}
        offsets = Counter(m.token for m in deliveries)
        twice = [_redone(m) for m in deliveries if len(_redone(m).runs) > 1]
        for message in twice:
            cause = cause_of(message, events)
            causes[cause or "unexplained"] += 1
            if cause is None:
                unexplained.append({"group": group, **describe(message, events)})
        # Ordered by offset: the offset is the key order's truth, so it is the id here.
        by_offset = [dataclasses.replace(m, id=facts.sequenced[m.token].offset)
                     for m in deliveries if m.token in facts.sequenced]
        violations = _order(by_offset, events)
        order += [{"group": group, **v} for v in violations]
        by_group[group] = {
            "handled": len(ok & published),
            "lost": len(published - ok),
            "lost_offsets": sorted(facts.sequenced[t].offset for t in published - ok
                                   if t in facts.sequenced)[:50],
            "runs": sum(len(runs) for (g, _), runs in facts.runs.items() if g == group),
            "failed_on_purpose": sum(run.outcome == "failed" for (g, _), runs
                                     in facts.runs.items() if g == group for run in runs),
            "duplicates": len(twice),
            "double_deliveries": sum(count > 1 for count in offsets.values()),
            "dead": sum(m.status == "dead" for m in deliveries),
            "still_queued": sum(m.status == "queued" for m in deliveries),
            "order_violations": len(violations),
            "position": facts.positions.get(group),
        }
    cast = broadcast.audit(lives, facts.sequenced, facts.heard, events)
    heard = {token for (_, token) in facts.heard}
    delivery_facts = Facts(everything, {}, 0, {})
    taken = claims.judge(delivery_facts, events, lease)
    rec = recovery(delivery_facts, events).as_dict()
    groups = by_group.values()
    metrics = {
        "topic_published": len(published),
        "topic_groups": len(by_group),
        "topic_lost": sum(g["lost"] for g in groups),
        "topic_unsequenced": facts.unsequenced + len(published - set(facts.sequenced)),
        "topic_rolled_back_seen": len(rolled_back & (set(facts.sequenced) | handled | heard)),
        "topic_phantoms": len(handled - published - rolled_back),
        "topic_failed_on_purpose": sum(g["failed_on_purpose"] for g in groups),
        "topic_double_deliveries": sum(g["double_deliveries"] for g in groups),
        "topic_duplicates": sum(g["duplicates"] for g in groups),
        "topic_unexplained_duplicates": len(unexplained),
        "topic_dead": sum(g["dead"] for g in groups),
        "topic_still_queued": sum(g["still_queued"] for g in groups),
        "topic_last_offset": facts.last_offset,
        "topic_positions_behind": sum(g["position"] != facts.last_offset for g in groups),
        "topic_order_violations": len(order),
        "topic_unexplained_claim_losses": len(taken["unexplained"]),
        "topic_recovery_median_seconds": rec["reclaim_seconds"]["median"],
        **cast["metrics"],
    }
    return {
        "metrics": metrics,
        "failures": [f"{key} = {metrics[key]}: {what}" for key, what in CHECKS
                     if metrics[key]],
        "topic_groups": by_group,
        "topic_duplicate_causes": dict(causes),
        "topic_unexplained": unexplained[:50],
        "topic_order_violations": order[:50],
        "topic_unexplained_claim_losses": taken["unexplained"][:50],
        "topic_recovery": rec,
        "broadcast_missed": cast["broadcast_missed"],
        "broadcast_before_start": cast["broadcast_before_start"],
    }

