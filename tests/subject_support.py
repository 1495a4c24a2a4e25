"""Helpers for the ordered-subject and concurrency-limit tests: broker calls as a worker
makes them, the state of messages and gates, and the ledger's verdicts."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence

from django.db import connection
from django.utils import timezone

from django_mysqlq import broker
from django_mysqlq.messages import AttemptResult, ClaimedMessage, Runner
from django_mysqlq.models import Gate, Message
from tests.testapp.models import GateRun

WORKER = "subject-test-worker"
RUNNER = Runner(worker_id=WORKER, host="test", pid=1, thread="t")


def claim(limit: int = 100, queues: Sequence[str] = ("default",)) -> list[ClaimedMessage]:
    return broker.claim(list(queues), limit, WORKER, lease_seconds=30)


def ok() -> AttemptResult:
    return AttemptResult(started_at=timezone.now())


def failed() -> AttemptResult:
    return AttemptResult(started_at=timezone.now(), error_class="RuntimeError",
                         error_message="boom")


def ack(messages: Iterable[ClaimedMessage]) -> set[int]:
    return broker.ack_many([(m, RUNNER, ok()) for m in messages])


def status(*ids: int) -> list[str | None]:
    found = dict(Message.objects.filter(pk__in=ids).values_list("pk", "status"))
    return [found.get(i) for i in ids]


def gate(key: str, ordered: bool = True, queue: str = "default") -> tuple[int, int] | None:
    """(active, blocked) of a gate, or None when it has no row."""
    row = Gate.objects.filter(queue=queue, ordered=ordered, gate_key=key) \
        .values_list("active", "blocked").first()
    return None if row is None else (int(row[0]), int(row[1]))


def set_gate(key: str, ordered: bool = True, **counters: int) -> None:
    """Change a gate's counters by hand (as a person with a SQL console would)."""
    Gate.objects.filter(gate_key=key, ordered=ordered).update(**counters)


def make_due(*ids: int) -> None:
    """Scheduled messages become due now (instead of waiting for their backoff)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE mysqlq_message SET run_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
                       f" WHERE id IN ({', '.join(['%s'] * len(ids))})", list(ids))


# --------------------------------------------------------------------------- the ledger

Run = tuple[float, float | None, int, str]  # start, end (None: never ended), seq, outcome


def runs(label: str) -> dict[str, list[Run]]:
    """Every run of ``label``'s tasks per key, in start order (a run killed with its worker
    has no end)."""
    edges = GateRun.objects.filter(label=label).order_by("at", "id") \
        .values_list("key", "seq", "edge", "outcome", "at", "pid", "thread")
    by_key: dict[str, list[Run]] = defaultdict(list)
    open_runs: dict[tuple[str, int, int, str], float] = {}
    for key, seq, edge, outcome, at, pid, thread in edges:
        who = (key, seq, pid, thread)
        if edge == "start":
            if who in open_runs:  # the previous run of this thread never ended (killed)
                by_key[key].append((open_runs.pop(who), None, seq, "killed"))
            open_runs[who] = at
        else:
            by_key[key].append((open_runs.pop(who), at, seq, outcome))
    for (key, seq, _, _), start in open_runs.items():
        by_key[key].append((start, None, seq, "killed"))
    return {key: sorted(found) for key, found in by_key.items()}


def order_violations(label: str, killed: frozenset[int] = frozenset(),
                     keys: Iterable[str] | None = None) -> list[str]:
    """Runs of an ordered subject that started out of order or alongside another run.

    A run that succeeded in a process killed with ``kill -9`` may run again (its ack may
    not have committed: at-least-once); any other success must be the last run of its seq.
    """
    problems = []
    found_runs = runs(label)
    pids = _pids(label)
    for key, found in found_runs.items():
        if keys is not None and key not in set(keys):
            continue
        for before, after in itertools.pairwise(found):
            if after[2] < before[2]:
                problems.append(f"{key}: #{after[2]} started after #{before[2]}")
            if before[1] is not None and after[0] < before[1]:
                problems.append(f"{key}: #{after[2]} started while #{before[2]} ran")
            if (before[3] == "ok" and after[2] == before[2]
                    and pids.get((key, before[2], before[0])) not in killed):
                problems.append(f"{key}: #{before[2]} ran again after it succeeded")
            if after[2] > before[2] and before[3] != "ok":
                problems.append(f"{key}: #{after[2]} started after #{before[2]} "
                                f"{before[3]} (not after its success)")
    return problems


def _pids(label: str) -> dict[tuple[str, int, float], int]:
    """The process of each run, by (key, seq, start)."""
    return {(key, seq, at): pid for key, seq, at, pid in GateRun.objects.filter(
        label=label, edge="start").values_list("key", "seq", "at", "pid")}


def most_at_once(label: str) -> dict[str, int]:
    """Per key, the most runs that overlapped (killed runs count until the next run of
    their message starts)."""
    most: dict[str, int] = {}
    for key, found in runs(label).items():
        events = []
        for index, (start, end, seq, _) in enumerate(found):
            if end is None:
                later = [s for s, _, q, _ in found[index + 1:] if q == seq]
                end = later[0] if later else start
            events += [(start, 1), (end, -1)]
        running = peak = 0
        for _, step in sorted(events, key=lambda e: (e[0], e[1])):
            running += step
            peak = max(peak, running)
        most[key] = peak
    return most


def succeeded_seqs(label: str) -> dict[str, list[int]]:
    return {key: [seq for _, _, seq, outcome in found if outcome == "ok"]
            for key, found in runs(label).items()}
