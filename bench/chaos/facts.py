"""Everything the run left in the database, read back per message."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from django.db.models import Count

from django_mysqlq.models import Attempt, Message

from .ledger.models import Edge, Effect, Enqueued, Execution


@dataclasses.dataclass
class Run:
    """One execution of a task body, from its ledger rows."""

    run: str
    pid: int
    attempt: int
    start: float
    end: float | None = None


@dataclasses.dataclass(frozen=True)
class Try:
    """One history row of the queue (``mysqlq_attempt``)."""

    attempt: int
    outcome: str
    pid: int | None
    started: float | None
    finished: float
    error_class: str
    error_message: str


@dataclasses.dataclass
class MessageFacts:
    id: int
    token: str
    kind: str
    #: The ordered subject or concurrency key ("" for other kinds).
    gate_key: str = ""
    #: ready, scheduled, claimed, blocked, dead (still in the queue table) or None (gone).
    queue_status: str | None = None
    runs: list[Run] = dataclasses.field(default_factory=list)
    tries: list[Try] = dataclasses.field(default_factory=list)
    effects: int = 0

    @property
    def succeeded(self) -> bool:
        return self.queue_status is None and any(t.outcome == "succeeded" for t in self.tries)

    @property
    def status(self) -> str:
        """succeeded, dead, queued, or lost (gone from the queue without a success)."""
        if self.queue_status == "dead":
            return "dead"
        if self.queue_status is not None:
            return "queued"
        return "succeeded" if self.succeeded else "lost"

    @property
    def executed(self) -> bool:
        return any(run.end is not None for run in self.runs)


@dataclasses.dataclass
class Facts:
    messages: dict[int, MessageFacts]
    #: Ledger runs whose token no committed enqueue wrote: token -> runs.
    phantoms: dict[str, list[Run]]
    #: Business rows of messages that are not atomic ones the producers committed.
    stray_effects: int
    outcomes: dict[str, int]


def pid_of(worker_id: str) -> int | None:
    """The pid in a worker id ``host:pid:suffix``."""
    parts = worker_id.rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def load() -> Facts:
    messages: dict[int, MessageFacts] = {}
    by_token: dict[str, MessageFacts] = {}
    for message_id, token, kind, gate_key in Enqueued.objects.values_list(
            "message_id", "token", "kind", "gate_key"):
        facts = MessageFacts(int(message_id), str(token), str(kind), str(gate_key))
        messages[facts.id] = by_token[facts.token] = facts

    for message_id, status in Message.objects.values_list("id", "status"):
        if message_id in messages:
            messages[message_id].queue_status = str(status)

    runs: dict[str, Run] = {}
    run_token: dict[str, str] = {}
    for run_id, edge, token, pid, attempt, at in Execution.objects.order_by("id").values_list(
            "run", "edge", "token", "pid", "attempt", "at"):
        run = runs.get(run_id)
        if run is None:
            run = runs[run_id] = Run(run_id, int(pid), int(attempt), float(at))
            run_token[run_id] = token
        if edge == Edge.START:
            run.start = float(at)
        else:
            run.end = float(at)
    phantoms: dict[str, list[Run]] = defaultdict(list)
    for run_id, run in runs.items():
        token = run_token[run_id]
        if token in by_token:
            by_token[token].runs.append(run)
        else:
            phantoms[token].append(run)

    outcomes: dict[str, int] = defaultdict(int)
    for row in Attempt.objects.order_by("id").values_list(
            "message_id", "attempt", "outcome", "worker_id", "started_at", "finished_at",
            "error_class", "error_message"):
        message_id, attempt, outcome, worker_id, started, finished, error_class, error = row
        outcomes[str(outcome)] += 1
        if message_id in messages:
            messages[message_id].tries.append(Try(
                int(attempt), str(outcome), pid_of(str(worker_id)),
                started.timestamp() if started is not None else None, finished.timestamp(),
                str(error_class), str(error)))

    stray = 0
    for message_id, count in Effect.objects.values_list("message_id").annotate(n=Count("id")):
        owner = messages.get(message_id)
        if owner is None or owner.kind != "atomic":
            stray += int(count)
        else:
            owner.effects = int(count)
    for facts in messages.values():
        facts.runs.sort(key=lambda run: run.start)
    return Facts(messages, dict(phantoms), stray, dict(outcomes))
