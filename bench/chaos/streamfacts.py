"""What the run left of its topic, read back: what was published, sequenced, delivered
to each group, handled (each run with its outcome) and heard by each process."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict

from django_mysqlq.models import Attempt, Message
from django_mysqlq.topicmodels import TopicDelivery, TopicGroup, TopicMessage, TopicState

from .broadcast import Sequenced
from .facts import MessageFacts, Run, Try, pid_of
from .ledger.models import Edge, Handled, Heard, Published
from .ledger.stream import FAILURE_RATES, TOPIC


@dataclasses.dataclass
class HandlerRun(Run):
    """One run of a group's handler: ``ok``, ``failed`` on purpose, or "" (cut short)."""

    outcome: str = ""


@dataclasses.dataclass
class StreamFacts:
    #: token -> key ("" for none), of every message a committed transaction published.
    published: dict[str, str]
    #: token -> its offset, for every sequenced message of the topic.
    sequenced: dict[str, Sequenced]
    #: Topic rows still without an offset.
    unsequenced: int
    #: group -> its deliveries, as queue messages (id: the delivery's message id; token,
    #: gate_key: the message's key; runs: its handler runs; tries: its history).
    deliveries: dict[str, list[MessageFacts]]
    #: (group, token) -> handler runs, whether or not a delivery links them.
    runs: dict[tuple[str, str], list[HandlerRun]]
    #: (pid, token) -> broadcast runs in that process.
    heard: dict[tuple[int, str], int]
    last_offset: int
    positions: dict[str, int]


def _token(payload: str) -> str:
    try:
        value = json.loads(payload)
    except ValueError:
        return ""
    return str(value.get("token", "")) if isinstance(value, dict) else ""


def _runs() -> dict[tuple[str, str], list[HandlerRun]]:
    runs: dict[str, HandlerRun] = {}
    owner: dict[str, tuple[str, str]] = {}
    for run_id, edge, outcome, token, group, pid, attempt, at in Handled.objects.order_by(
            "id").values_list("run", "edge", "outcome", "token", "group", "pid", "attempt",
                              "at"):
        run = runs.get(run_id)
        if run is None:
            run = runs[run_id] = HandlerRun(run_id, int(pid), int(attempt), float(at))
            owner[run_id] = (str(group), str(token))
        if edge == Edge.START:
            run.start = float(at)
        else:
            run.end, run.outcome = float(at), str(outcome)
    by_pair: dict[tuple[str, str], list[HandlerRun]] = defaultdict(list)
    for run_id, run in runs.items():
        by_pair[owner[run_id]].append(run)
    for pair_runs in by_pair.values():
        pair_runs.sort(key=lambda run: run.start)
    return dict(by_pair)


def _tries(ids: set[int]) -> dict[int, list[Try]]:
    tries: dict[int, list[Try]] = defaultdict(list)
    rows = Attempt.objects.filter(task_name__startswith=f"topic:{TOPIC.name}:").order_by(
        "id").values_list("message_id", "attempt", "outcome", "worker_id", "started_at",
                          "finished_at", "error_class", "error_message")
    for message_id, attempt, outcome, worker_id, started, finished, error_class, error in rows:
        if message_id in ids:
            tries[message_id].append(Try(
                int(attempt), str(outcome), pid_of(str(worker_id)),
                started.timestamp() if started is not None else None, finished.timestamp(),
                str(error_class), str(error)))
    return tries


def load() -> StreamFacts:
    published = dict(Published.objects.values_list("token", "key"))
    sequenced: dict[str, Sequenced] = {}
    by_offset: dict[int, tuple[str, str]] = {}
    unsequenced = 0
    for offset, key, payload, at in TopicMessage.objects.filter(topic=TOPIC.name).values_list(
            "offset", "key", "payload", "sequenced_at"):
        if offset is None or at is None:
            unsequenced += 1
            continue
        token = _token(payload)
        sequenced[token] = Sequenced(int(offset), at.timestamp())
        by_offset[int(offset)] = (token, str(key or ""))
    runs = _runs()
    links = list(TopicDelivery.objects.filter(topic=TOPIC.name).values_list(
        "message_id", "group_name", "offset"))
    ids = {int(message_id) for message_id, _, _ in links}
    statuses = {int(i): str(s) for i, s in Message.objects.filter(pk__in=ids).values_list(
        "id", "status")}
    tries = _tries(ids)
    deliveries: dict[str, list[MessageFacts]] = {group: [] for group in FAILURE_RATES}
    for message_id, group, offset in links:
        token, key = by_offset.get(int(offset), ("", ""))
        facts = MessageFacts(int(message_id), token, f"topic:{group}", key,
                             statuses.get(int(message_id)))
        facts.runs = list(runs.get((str(group), token), []))
        facts.tries = tries.get(int(message_id), [])
        deliveries.setdefault(str(group), []).append(facts)
    heard: dict[tuple[int, str], int] = defaultdict(int)
    for pid, token in Heard.objects.values_list("pid", "token"):
        heard[(int(pid), str(token))] += 1
    state = TopicState.objects.filter(name=TOPIC.name).values_list("last_offset", flat=True)
    positions = dict(TopicGroup.objects.filter(topic=TOPIC.name).values_list(
        "group_name", "position"))
    return StreamFacts(published, sequenced, unsequenced, deliveries, runs, dict(heard),
                       int(state[0]) if state else 0,
                       {str(g): int(p) for g, p in positions.items()})
