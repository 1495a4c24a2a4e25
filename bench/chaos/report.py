"""The run's verdict as a markdown table, and as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import GATE_LIMIT, RATE_LIMIT, RATE_SLACK, RATE_WINDOW_SECONDS

ROWS = (
    ("enqueued", "messages committed by producers"),
    ("executed", "distinct messages whose task body ran to its end"),
    ("succeeded", "acked (gone from the queue with a succeeded history row)"),
    ("duplicates", "messages whose body started more than once"),
    ("unexplained_duplicates", "... with no kill -9, KILL CONNECTION or restart to explain"),
    ("lost", "gone from the queue without a success"),
    ("dead", "dead (out of attempts)"),
    ("still_queued", "still ready/scheduled/claimed after the drain"),
    ("atomic_messages", "atomic messages"),
    ("atomic_violations", "atomic messages without exactly one business row per success"),
    ("stray_effects", "business rows of no committed atomic message"),
    ("acked_without_run", "acked without a finished run"),
    ("phantom_runs", "runs of messages no committed transaction enqueued"),
    ("rolled_back_that_ran", "messages of rolled-back transactions that ran"),
    ("late_ack_rows", "messages with a second succeeded history row (late ack)"),
    ("unexplained_claim_losses", "claims taken back with no kill, KILL or restart on the holder"),
    ("stalled_claims", "claims held unstarted for longer than a lease, then taken back"),
    ("longest_stall_seconds", "longest such hold"),
    ("kills", "kill -9 of a worker"),
    ("sigterms", "SIGTERM of a worker (graceful stop)"),
    ("connection_kills", "KILL CONNECTION of all of a worker's connections"),
    ("restarts", "MariaDB restarts"),
    ("node_kills", "kill -9 of a Galera node, started again after a while (--galera)"),
    ("crashes", "workers that exited by themselves"),
    ("unexplained_crashes", "... not by running the crashing task"),
    ("crashing_tasks", "messages of a task that kills its worker (os._exit), enqueued"),
    ("crashing_tasks_not_dead", "... not dead at the end (each must spend its own attempts)"),
    ("locked_rows", "ready or scheduled rows held FOR UPDATE by the harness for a while"),
    ("stalled_locks", "... during which no other message finished"),
    ("unclean_stops", "SIGTERMed workers that overran or exited non-zero"),
    ("unclean_stops_node_down", "SIGTERMed workers whose Galera node was killed during "
     "the stop (excused)"),
    ("stopped_starting", "SIGTERMed workers that had not started yet: ended by the "
     "signal before they held anything (excused)"),
    ("recovery_median_seconds", "kill -9 to orphan claimed again: median"),
    ("recovery_max_seconds", "kill -9 to orphan claimed again: max"),
    ("kill_orphans_node_down", "kill -9 orphans whose wait overlapped a Galera node kill "
     "(the sweeper's node may be gone: left out of the two figures above)"),
    ("node_kill_orphans", "claims of workers on the killed node, taken back"),
    ("node_recovery_median_seconds", "node kill -9 to such a claim claimed again: median"),
    ("node_recovery_max_seconds", "node kill -9 to such a claim claimed again: max"),
    ("node_down_seconds", "node kill -9 to the node Synced again, per kill"),
    ("ordered_messages", "messages in an ordered subject"),
    ("order_violations", "... started before the message enqueued before them had ended"),
    ("limited_messages", f"messages under a concurrency key (limit {GATE_LIMIT})"),
    ("limit_violations", "... keys that ran more than their limit at once"),
    ("limit_peak", "most runs of one key at once"),
    ("rated_messages", f"messages under a rate key ({RATE_LIMIT} starts per "
                       f"{RATE_WINDOW_SECONDS} s)"),
    ("rate_violations", f"... keys that started more than {RATE_LIMIT} + {RATE_SLACK} "
                        "(slack) in a window"),
    ("rate_peak", "most starts of one rate key in a window"),
    ("topic_published", "topic messages committed by producers (publish and publish_many)"),
    ("topic_published_bulk", "... of them by publish_many"),
    ("topic_rolled_back", "topic messages in transactions rolled back on purpose"),
    ("topic_rolled_back_seen", "... sequenced, handled or heard anyway"),
    ("topic_unsequenced", "committed topic messages without an offset at the end"),
    ("topic_groups", "consumer groups (billing 5 %, shipping 10 %, audit 30 % failures)"),
    ("topic_lost", "(group, message) pairs of a committed publish never handled"),
    ("topic_phantoms", "handler runs of messages no committed transaction published"),
    ("topic_failed_on_purpose", "handler runs failed on purpose (then retried)"),
    ("topic_double_deliveries", "(group, offset) pairs made into more than one delivery"),
    ("topic_duplicates", "(group, message) pairs handled again other than after a failure"),
    ("topic_unexplained_duplicates", "... with no kill -9, KILL, restart or crash to explain"),
    ("topic_dead", "deliveries dead"),
    ("topic_still_queued", "deliveries still queued after the drain"),
    ("topic_last_offset", "the topic's last offset"),
    ("topic_positions_behind", "groups whose position is not the last offset at the end"),
    ("topic_order_violations", "keyed messages started before the key's previous one ended"),
    ("topic_unexplained_claim_losses", "delivery claims taken back from a live worker"),
    ("topic_recovery_median_seconds", "kill -9 to a delivery orphan claimed again: median"),
    ("broadcast_processes", "worker processes that started their broadcast reader"),
    ("broadcast_owed", "(process, message) pairs owed: sequenced after its start, outlived"),
    ("broadcast_heard", "... heard"),
    ("broadcast_missed", "... never heard"),
    ("broadcast_excused_start", "pairs excused: sequenced while the process was starting"),
    ("broadcast_excused_end", "pairs excused: the process ended within the grace after it"),
    ("broadcast_excused_end_heard", "... heard all the same"),
    ("broadcast_before_start", "messages heard by a process started after them"),
    ("broadcast_duplicates", "messages heard twice by one process"),
)


def markdown(result: dict[str, Any]) -> str:
    metrics = result["metrics"]
    lines = ["| metric | value | meaning |", "| --- | ---: | --- |"]
    for key, meaning in ROWS:
        value = metrics.get(key)
        lines.append(f"| {key} | {'-' if value is None else value} | {meaning} |")
    causes = ", ".join(f"{k} {v}" for k, v in sorted(result["duplicate_causes"].items()))
    topic_causes = ", ".join(f"{k} {v}" for k, v in
                             sorted(result.get("topic_duplicate_causes", {}).items()))
    recovery = result["recovery"]
    timing = result.get("timing", {})
    lines += [
        "",
        f"Duplicates by cause: {causes or 'none'}.",
        f"Topic duplicates by cause: {topic_causes or 'none'}.",
        f"Per group: {_groups(result)}.",
        f"Kill -9 orphans: {recovery['orphans']}; sweep after the kill median "
        f"{recovery['sweep_seconds']['median']} s, max {recovery['sweep_seconds']['max']} s.",
        f"First success after each restart (or node's return): "
        f"{result['restart_resume_seconds']} s.",
        f"History outcomes: {result['history_outcomes']}.",
        f"Lost-claim reasons: {result['lost_reasons']}.",
    ]
    if result["retried_errors"]:
        lines.append(f"Retried attempts by error: {result['retried_errors']}.")
    if result.get("log_errors"):
        lines.append(f"ERROR lines in worker logs: {result['log_errors']}.")
    if timing:
        lines.append("Timing: " + ", ".join(f"{k} {v} s" for k, v in timing.items()) + ".")
    lines += _examples(result)
    lines.append("")
    if result["failures"]:
        lines.append("**FAILED**:")
        lines += [f"- {failure}" for failure in result["failures"]]
    else:
        lines.append("**OK**: nothing lost, every duplicate explained, atomic work exactly once; "
                     "every group handled every published message, in key order; broadcast "
                     "heard by every live process.")
    return "\n".join(lines)


def _groups(result: dict[str, Any]) -> str:
    groups = result.get("topic_groups") or {}
    return "; ".join(f"{name} handled {g['handled']}, runs {g['runs']}, failed on purpose "
                     f"{g['failed_on_purpose']}, duplicates {g['duplicates']}"
                     for name, g in sorted(groups.items())) or "none"


def _examples(result: dict[str, Any]) -> list[str]:
    """A few pieces of evidence per failed check (all of it is in the JSON)."""
    lines = []
    for key, title in (("unexplained", "Unexplained duplicates"),
                       ("unexplained_claim_losses", "Unexplained claim losses"),
                       ("stalled_claims", "Stalled claims"),
                       ("topic_unexplained", "Unexplained topic duplicates"),
                       ("topic_order_violations", "Topic key order violations"),
                       ("broadcast_missed", "Broadcast messages missed")):
        items = result.get(key) or []
        if items:
            lines.append(f"{title} (first {min(3, len(items))} of {len(items)}):")
            lines += [f"- `{json.dumps(item, default=str)}`" for item in items[:3]]
    return lines


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
