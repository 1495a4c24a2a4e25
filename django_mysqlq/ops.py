"""Operator operations shared by the admin and the management commands.

Selecting messages is a read (the ORM); changing them always goes through the broker,
in batches, so the admin and the CLI behave the same and a long operation can report
progress and never holds locks for long.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import getpass
import os
import re
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from . import broker, limits, payload, rating, scheduling
from .broker import Operator
from .exceptions import QueueError, UnknownTask
from .models import CANCELLABLE_STATUSES, Attempt, Message, MessageStatus, Outcome
from .registry import registry

if TYPE_CHECKING:
    from .tasks import QueueTask

#: Messages per broker call when an operation walks a filter.
BATCH = 500

Progress = Callable[[int, int], None]


def operator(name: str, via: str) -> Operator:
    """The operator as history records it: ``admin:alice`` or ``cli:root``."""
    return Operator(name=f"{via}:{name}", host=socket.gethostname(), pid=os.getpid())


def cli_operator() -> Operator:
    """The person at the terminal (their login name), for the management commands: the
    terminal's login, else the environment's (``LOGNAME``, ``USER``), else the account the
    process runs as (cron, ``docker exec``, systemd have no terminal and may set none)."""
    try:
        name = os.getlogin()
    except OSError:
        try:
            name = getpass.getuser()
        except (OSError, KeyError):  # no such variables and no password entry
            name = "unknown"
    return operator(name, "cli")


def replay(attempt_id: int, who: Operator) -> int:
    """Enqueue a copy of a finished message, with its task's current attempts and backoff.

    A task this process doesn't know gets the settings' defaults.
    """
    found = Attempt.objects.using(broker.default_alias()).filter(pk=attempt_id) \
        .values_list("task_name", "payload").first()
    task_name, text = found if found is not None else ("", "")
    try:
        task = registry.get(task_name or "")
    except UnknownTask:
        return broker.replay(attempt_id, who)
    return broker.replay(attempt_id, who, (task.max_attempts, task.retry_backoff, task.timeout),
                         _rate_of_copy(task, text))


def _rate_of_copy(task: QueueTask[Any, Any], text: str) -> broker.RateOfCopy | None:
    """A replayed copy's rate key, from the task's declaration and the stored arguments
    (None when the task has no rate limit, or the arguments can't give a key)."""
    if task.rate is None or not text:
        return None
    try:
        args, kwargs = payload.decode(text)
        found = rating.for_call(task.rate, task.func, task.name, args, kwargs, None)
    except (QueueError, ValueError, TypeError):
        return None
    return None if found is None else (found[0], found[1], task.rate.spec)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
#: ``-2h``: a duration ago written as if negative (refused, saying to drop the dash).
_DURATION_WITH_DASH = re.compile(r"^\s*-\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: The longest duration as the largest whole number of weeks, for error messages.
_LONGEST = f"{limits.MAX_SECONDS // _UNITS['w']}w"


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``12h``, ``30d``, ``2w`` → a timedelta of at most 100 years."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"expected a duration like 90s, 15m, 12h, 30d or 2w, not {text!r}")
    seconds = float(match[1]) * _UNITS[match[2]]  # inf for absurdly many digits
    if not seconds <= limits.MAX_SECONDS:
        raise ValueError(f"expected a duration of at most 100 years ({_LONGEST}), "
                         f"not {text!r}")
    return dt.timedelta(seconds=seconds)


def without_dash(text: str) -> str | None:
    """``2h`` for ``-2h`` (a duration ago written with a dash, which means nothing more:
    refused saying what to write); None for anything else."""
    dashed = _DURATION_WITH_DASH.match(text)
    return f"{dashed[1]}{dashed[2]}" if dashed else None


def parse_since(text: str) -> dt.datetime:
    """A duration ago (``2h``) or an ISO date/time (UTC when it has no offset)."""
    if _DURATION.match(text):
        return timezone.now() - parse_duration(text)
    undashed = without_dash(text)
    if undashed:
        raise ValueError(f"expected a duration ago without a dash: write {undashed}, not "
                         f"{text.strip()} (a duration counts back from now)")
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected a duration (2h, 3d) or an ISO date/time "
                         f"(2026-11-23T08:00), not {text!r}") from None
    value = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    try:
        value.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError(f"expected a date/time from year 1 to 9999 once in UTC, "
                         f"not {text!r}") from None
    return value


@dataclasses.dataclass(frozen=True)
class MessageFilter:
    """Which messages a bulk operation applies to; every given criterion must match."""

    queues: Sequence[str] = ()
    tasks: Sequence[str] = ()
    statuses: Sequence[str] = ()
    since: dt.datetime | None = None

    def query(self) -> Q:
        q = Q()
        if self.queues:
            q &= Q(queue__in=list(self.queues))
        if self.tasks:
            q &= Q(task_name__in=list(self.tasks))
        if self.statuses:
            q &= Q(status__in=list(self.statuses))
        if self.since is not None:
            q &= Q(enqueued_at__gte=self.since)
        return q


def matching_ids(selection: MessageFilter | Sequence[int]) -> Iterator[list[int]]:
    """Batches of ids of operable messages matching a filter (or among given ids).

    Keyset pagination by id, so a million matches never become one huge query.
    """
    base = Message.objects.using(broker.default_alias()) \
        .filter(status__in=list(CANCELLABLE_STATUSES))
    if isinstance(selection, MessageFilter):
        base = base.filter(selection.query())
    else:
        base = base.filter(pk__in=list(selection))
    yield from id_batches(base)


def id_batches(queryset: QuerySet[Message]) -> Iterator[list[int]]:
    """The ids of ``queryset`` in batches of ``BATCH``, walked by id (keyset): no statement
    carries more than a batch, and a row is met once even if it changes meanwhile."""
    last = 0
    while True:
        batch = list(queryset.filter(pk__gt=last).order_by("pk")
                     .values_list("pk", flat=True)[:BATCH])
        if not batch:
            return
        yield batch
        last = batch[-1]


def requeue_dead_of(queryset: QuerySet[Message], who: Operator, *,
                    reset_attempts: bool = False) -> tuple[list[int], int]:
    """Requeue the dead messages of ``queryset`` (an admin list's filter), batch by batch;
    return the ids requeued and how many were met dead. One that is no longer dead when
    it is locked (someone requeued it meanwhile) is left alone, its attempts untouched."""
    done: list[int] = []
    seen = 0
    for batch in id_batches(queryset.filter(status=MessageStatus.DEAD)):
        seen += len(batch)
        done.extend(broker.requeue(batch, who, reset_attempts=reset_attempts,
                                   statuses=(MessageStatus.DEAD,)))
    return done, seen


def count_matching(selection: MessageFilter) -> int:
    return Message.objects.using(broker.default_alias()) \
        .filter(status__in=list(CANCELLABLE_STATUSES)).filter(selection.query()).count()


def _apply(selection: MessageFilter | Sequence[int], action: Callable[[list[int]], list[int]],
           progress: Progress | None) -> list[int]:
    total = count_matching(selection) if isinstance(selection, MessageFilter) \
        else len(selection)
    done: list[int] = []
    for batch in matching_ids(selection):
        done.extend(action(batch))
        if progress is not None:
            progress(len(done), total)
    return done


def requeue_matching(selection: MessageFilter | Sequence[int], who: Operator, *,
                     reset_attempts: bool = False, progress: Progress | None = None) -> list[int]:
    return _apply(selection, lambda ids: broker.requeue(ids, who, reset_attempts=reset_attempts),
                  progress)


def cancel_matching(selection: MessageFilter | Sequence[int], who: Operator, *,
                    progress: Progress | None = None) -> list[int]:
    return _apply(selection, lambda ids: broker.cancel(ids, who), progress)


def _purge(total: int, delete_batch: Callable[[], int], batch: int,
           progress: Progress | None) -> int:
    """Call ``delete_batch`` until a batch comes back short; return how many went."""
    deleted = 0
    while True:
        count = delete_batch()
        deleted += count
        if progress is not None and count:
            progress(deleted, max(total, deleted))
        if count < batch:
            return deleted


def purge_history(older_than: dt.timedelta, *, batch: int = 1000,
                  progress: Progress | None = None) -> int:
    """Delete history finished more than ``older_than`` ago, ``batch`` rows per statement."""
    before = broker.database_now() - older_than
    return _purge(broker.count_history_before(before),
                  lambda: broker.purge_history_batch(before, batch), batch, progress)


def purge_dead(older_than: dt.timedelta, who: Operator, *, batch: int = 1000,
               progress: Progress | None = None) -> int:
    """Delete messages that died more than ``older_than`` ago, keeping a history row each."""
    before = broker.database_now() - older_than
    return _purge(broker.count_dead_before(before),
                  lambda: broker.purge_dead_batch(before, batch, who), batch, progress)


def purge_workers(older_than: dt.timedelta, *, batch: int = 1000,
                  progress: Progress | None = None) -> int:
    """Delete rows of workers stopped and silent for more than ``older_than``."""
    before = broker.database_now() - older_than
    return _purge(broker.count_workers_before(before),
                  lambda: broker.purge_workers_batch(before, batch), batch, progress)


# --------------------------------------------------------------------------- dashboard

#: Windows of the throughput columns, in minutes.
WINDOWS = (1, 5, 60)
FAILURES = (Outcome.RETRIED, Outcome.FAILED, Outcome.LOST)


@dataclasses.dataclass
class QueueStats:
    """One dashboard row."""

    name: str
    ready: int = 0
    scheduled: int = 0
    claimed: int = 0
    dead: int = 0
    blocked: int = 0
    #: Due, waiting for their rate limit's next start.
    throttled: int = 0
    oldest_ready_seconds: float | None = None
    paused: bool = False
    #: It has ready messages and no live worker serves it: they wait for nobody.
    unserved: bool = False
    #: Attempts finished in the last 1, 5 and 60 minutes.
    throughput: dict[int, int] = dataclasses.field(default_factory=dict)
    failures_60: int = 0
    #: Statuses whose count stopped at the dashboard's cap: there are more.
    capped: frozenset[str] = frozenset()

    @property
    def failure_rate(self) -> float | None:
        finished = self.throughput.get(60, 0)
        return self.failures_60 / finished if finished else None


@dataclasses.dataclass
class Dashboard:
    """Everything the dashboard page and ``queuestats`` show."""

    queues: list[QueueStats]
    workers_alive: int
    stuck: int
    #: (task, failures in the last hour), most first.
    top_failing: list[tuple[str, int]]
    #: Attempts per minute, oldest first (index 59 = the current minute), and failures.
    per_minute: list[int]
    failures_per_minute: list[int]
    #: The server's purge lag (it slows every claim) and its warning, if past a threshold.
    purge_lag: broker.PurgeLag
    purge_warning: str | None
    #: Queues with ready messages that no live worker serves, by name.
    unserved: list[broker.UnservedQueue] = dataclasses.field(default_factory=list)
    #: Recurring tasks with their last and next run.
    schedules: list[scheduling.ScheduleStatus] = dataclasses.field(default_factory=list)
    #: Topics (busiest first), consumer groups with their lag, group handlers past their
    #: timeout (see docs/streams.md, monitoring).
    topics: list[broker.TopicVolume] = dataclasses.field(default_factory=list)
    groups: list[broker.GroupState] = dataclasses.field(default_factory=list)
    overran: list[broker.Overran] = dataclasses.field(default_factory=list)
    #: Live workers in which something keeps failing (an upkeep step, a broadcast read,
    #: a group's pump), as their last heartbeat said.
    worker_troubles: list[broker.WorkerTroubles] = dataclasses.field(default_factory=list)

    @property
    def unserved_text(self) -> str:
        """``queues with messages that no worker serves: emails (1,204 ready, …)``, or ''."""
        return broker.describe_unserved(self.unserved) if self.unserved else ""

    def as_json(self) -> dict[str, object]:
        return {
            "workers_alive": self.workers_alive,
            "stuck": self.stuck,
            "unserved": [queue.as_json() for queue in self.unserved],
            "purge_lag": {**self.purge_lag.as_json(), "warning": self.purge_warning},
            "queues": [
                {**{k: v for k, v in dataclasses.asdict(q).items()
                    if k not in ("throughput", "capped")},
                 "throughput": {f"{m}m": q.throughput.get(m, 0) for m in WINDOWS},
                 "failure_rate": q.failure_rate}
                for q in self.queues
            ],
            "top_failing": [{"task": t, "failures": n} for t, n in self.top_failing],
            "per_minute": self.per_minute,
            "schedules": [schedule.as_json() for schedule in self.schedules],
            "topics": [topic.as_json() for topic in self.topics],
            "groups": [group.as_json() for group in self.groups],
            "overran": [{"message_id": o.message_id, "task": o.task_name,
                         "worker": o.worker_id, "seconds": o.running_seconds,
                         "timeout": o.timeout, "topic": o.topic, "group": o.group,
                         "offset": o.offset} for o in self.overran],
            "worker_troubles": [worker.as_json() for worker in self.worker_troubles],
        }


def dashboard(top: int = 10, count_cap: int | None = None,
              queue_alias: str | None = None) -> Dashboard:
    """Read the queue's state: a handful of indexed statements (see docs/operations.md).

    With ``count_cap`` (the admin's page), message counts stop there, so the page costs the
    same however big the backlog; without it (``queuestats``) they are exact.
    ``queue_alias`` is the queue database shown when it is read from a replica: the
    schedules declared for its queues that no worker has written yet are listed too, and
    stuck claims and purge lag are read on it, not on the replica (a claim's owner is in
    the source's process list; the transaction holding purge back is the source's).
    """
    overview = broker.queue_overview(count_cap)
    history = broker.history_window(max(WINDOWS))
    paused = broker.paused_queues()
    now = broker.database_now()
    names = sorted(set(overview) | {b.queue for b in history} | paused)
    stats = {name: QueueStats(name, paused=name in paused) for name in names}
    for name, view in overview.items():
        row = stats[name]
        row.ready = view.counts.get(MessageStatus.READY, 0)
        row.scheduled = view.counts.get(MessageStatus.SCHEDULED, 0)
        row.claimed = view.counts.get(MessageStatus.CLAIMED, 0)
        row.dead = view.counts.get(MessageStatus.DEAD, 0)
        row.blocked = view.counts.get(MessageStatus.BLOCKED, 0)
        row.throttled = view.counts.get(MessageStatus.THROTTLED, 0)
        row.capped = view.capped
        if view.oldest_ready_at is not None:
            row.oldest_ready_seconds = max(0.0, (now - view.oldest_ready_at).total_seconds())
    failing: dict[str, int] = {}
    per_minute = [0] * max(WINDOWS)
    failures_per_minute = [0] * max(WINDOWS)
    for bucket in history:
        row = stats[bucket.queue]
        failed = bucket.outcome in FAILURES
        for window in WINDOWS:
            if bucket.minutes_ago < window:
                row.throughput[window] = row.throughput.get(window, 0) + bucket.count
        if failed:
            row.failures_60 += bucket.count
            failing[bucket.task_name] = failing.get(bucket.task_name, 0) + bucket.count
        if 0 <= bucket.minutes_ago < len(per_minute):
            slot = len(per_minute) - 1 - bucket.minutes_ago
            per_minute[slot] += bucket.count
            if failed:
                failures_per_minute[slot] += bucket.count
    top_failing = sorted(failing.items(), key=lambda item: (-item[1], item[0]))[:top]
    lag = broker.purge_lag(queue_alias)
    with broker.on_alias(queue_alias):
        stuck = len(broker.stuck_messages())
    unserved = broker.unserved_from(overview, broker.served_queues(), now)
    for queue in unserved:
        stats[queue.queue].unserved = True
    return Dashboard(queues=list(stats.values()), workers_alive=broker.workers_alive(),
                     stuck=stuck, top_failing=top_failing,
                     per_minute=per_minute, failures_per_minute=failures_per_minute,
                     purge_lag=lag, purge_warning=lag.warning(), unserved=unserved,
                     schedules=scheduling.statuses(queue_alias), topics=broker.topic_volumes(),
                     groups=broker.groups(), overran=broker.overran_deliveries(),
                     worker_troubles=broker.worker_troubles())


# --------------------------------------------------------------------------- subjects


@dataclasses.dataclass(frozen=True)
class SubjectState:
    """An ordered subject or concurrency key as an operator sees it."""

    gate: broker.GateRef
    #: (slots, active, blocked) from its gate row; None when it has no row (nothing in it).
    counters: tuple[int, int, int] | None
    holders: list[broker.Holder]

    @property
    def dead_heads(self) -> list[int]:
        return [h.id for h in self.holders if h.status == MessageStatus.DEAD]


def subject_state(queue: str, key: str, *, ordered: bool = True) -> SubjectState:
    """The gate's counters and the messages holding it."""
    from .models import Gate

    ref = broker.GateRef(queue, ordered, key)
    row = Gate.objects.using(broker.default_alias()).filter(pk=ref.id) \
        .values_list("slots", "active", "blocked").first()
    return SubjectState(ref, None if row is None else (int(row[0]), int(row[1]), int(row[2])),
                        broker.holders([ref])[ref])


def release_subject(queue: str, key: str, who: Operator) -> tuple[list[int], list[int]]:
    """Release a subject its dead head holds (the head stays dead); the heads released,
    and the messages that waited behind them and now run (none when nothing waited)."""
    return broker.release_subjects_promoting(subject_state(queue, key).dead_heads, who)


def requeue_subject_head(queue: str, key: str, who: Operator) -> list[int]:
    """Requeue the dead head holding a subject (it runs next, with a full set of attempts)."""
    return broker.requeue_heads(subject_state(queue, key).dead_heads, who)
