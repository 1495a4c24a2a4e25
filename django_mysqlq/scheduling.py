"""Recurring tasks as an operator sees them: what the admin, ``queuestats`` and
``queueschedule`` show, and the pause, resume, prune and run-now they share (through the
broker)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

from . import broker, cron
from .broker import DeclaredSchedule, Operator
from .models import Schedule

ACTIVE, PAUSED, REMOVED, BROKEN = "active", "paused", "removed", "broken"

logger = logging.getLogger("django_mysqlq")


@dataclasses.dataclass(frozen=True)
class ScheduleStatus:
    """One schedule row, with the state an operator reads first."""

    name: str
    source: str
    task_name: str
    queue: str
    cron: str
    timezone: str
    catch_up: str
    #: ``active``, ``paused``, ``removed`` (no worker's code declares it any more) or
    #: ``broken`` (its row can't be read: see ``error``).
    state: str
    next_run_at: dt.datetime | None
    last_run_at: dt.datetime | None
    last_enqueued_at: dt.datetime | None
    last_message_id: int | None
    error: str
    changed_by: str
    changed_at: dt.datetime | None
    #: False for a schedule this code or settings declare that no worker (nor
    #: ``queueschedule``) has written yet: its next run is computed from its expression,
    #: it has never run, and it can't be paused until its row exists.
    stored: bool = True

    @classmethod
    def of(cls, row: Schedule) -> ScheduleStatus:
        state = (REMOVED if row.removed_at is not None else BROKEN if row.error
                 else PAUSED if row.paused else ACTIVE)
        return cls(name=row.name, source=row.source, task_name=row.task_name,
                   queue=row.queue, cron=row.cron, timezone=row.timezone,
                   catch_up=row.catch_up, state=state,
                   next_run_at=None if state != ACTIVE else row.next_run_at,
                   last_run_at=row.last_run_at, last_enqueued_at=row.last_enqueued_at,
                   last_message_id=row.last_message_id, error=row.error,
                   changed_by=row.changed_by, changed_at=row.changed_at)

    @classmethod
    def unstored(cls, schedule: DeclaredSchedule, now: dt.datetime) -> ScheduleStatus:
        """A declared schedule with no row yet, as its first worker would write it."""
        try:
            following: dt.datetime | None = cron.Cron.parse(
                schedule.cron, schedule.timezone).after(now)
            state, error = ACTIVE, ""
        except ValueError as exc:  # checked when declared: a zone this machine lost
            following, state, error = None, BROKEN, str(exc)
        return cls(name=schedule.name, source=schedule.source,
                   task_name=schedule.task_name, queue=schedule.queue, cron=schedule.cron,
                   timezone=schedule.timezone, catch_up=schedule.catch_up, state=state,
                   next_run_at=following, last_run_at=None, last_enqueued_at=None,
                   last_message_id=None, error=error, changed_by="", changed_at=None,
                   stored=False)

    def local(self, moment: dt.datetime | None) -> str:
        """A time in the schedule's zone, ``2025-11-02 01:30 EDT``; ``-`` for none."""
        if moment is None:
            return "-"
        try:
            return moment.astimezone(ZoneInfo(self.timezone)).strftime("%Y-%m-%d %H:%M:%S %Z")
        except (ZoneInfoNotFoundError, ValueError, OSError, OverflowError):
            return moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    @property
    def next_local(self) -> str:
        return self.local(self.next_run_at) if self.state == ACTIVE else f"- ({self.state})"

    @property
    def last_local(self) -> str:
        return "never" if not self.stored else self.local(self.last_run_at)

    @property
    def state_text(self) -> str:
        """The state, marked when no row holds the schedule yet."""
        return self.state if self.stored else f"{self.state} (not written yet)"

    def as_json(self) -> dict[str, object]:
        def iso(moment: dt.datetime | None) -> str | None:
            return None if moment is None else moment.isoformat()

        return {"name": self.name, "source": self.source, "task": self.task_name,
                "queue": self.queue, "cron": self.cron, "timezone": self.timezone,
                "catch_up": self.catch_up, "state": self.state, "paused": self.state == PAUSED,
                "next_run_at": iso(self.next_run_at), "last_run_at": iso(self.last_run_at),
                "last_enqueued_at": iso(self.last_enqueued_at),
                "last_message_id": self.last_message_id, "error": self.error,
                "changed_by": self.changed_by, "changed_at": iso(self.changed_at),
                "stored": self.stored}


def write_declared() -> tuple[list[str], list[str]]:
    """Write the schedules this code and settings declare that no worker has written yet
    (on the queue database in use), so an operator can list, pause or run them before the
    first worker starts. Existing rows stay as they are. A declaration that is wrong is
    left out, the others written. Returns the names added and what is wrong with the
    declarations (one message each, as the system check ``django_mysqlq.E006`` says);
    none is written while a task module can't be imported (E005: the problem says which)."""
    from . import recurring
    from .registry import import_task_modules
    from .routing import alias_for_queue

    try:
        import_task_modules()
    except ImproperlyConfigured as exc:
        return [], [f"none is written until every task module imports: {exc}"]
    here = broker.default_alias()
    declared = [each for each in recurring.declared_leniently()
                if alias_for_queue(each.queue) == here]
    return broker.add_missing_schedules(declared, here), recurring.problems()


def statuses(queue_alias: str | None = None) -> list[ScheduleStatus]:
    """Every schedule row, and every schedule this code and settings declare for the queues
    of ``queue_alias`` (default: the alias in use) that has no row yet (``stored`` False),
    by name. Reads only (a few rows: read whole)."""
    rows = [ScheduleStatus.of(row)
            for row in Schedule.objects.using(broker.default_alias()).order_by("name")]
    rows.extend(unstored(queue_alias or broker.default_alias(), {row.name for row in rows}))
    return sorted(rows, key=lambda status: status.name)


def unstored(queue_alias: str, stored: set[str]) -> list[ScheduleStatus]:
    """The schedules declared here for the queues of ``queue_alias`` whose names are not in
    ``stored``, with their next run computed now; nothing read or written. A declaration
    that is wrong is left out (the system check ``django_mysqlq.E006`` names it), as are
    all of them when a task module can't be imported."""
    from . import recurring
    from .registry import import_task_modules
    from .routing import alias_for_queue

    try:
        import_task_modules()
    except ImproperlyConfigured:
        return []
    now = dt.datetime.now(dt.UTC)
    return [ScheduleStatus.unstored(each, now) for each in recurring.declared_leniently()
            if each.name not in stored and alias_for_queue(each.queue) == queue_alias]


def known_names() -> set[str]:
    return set(Schedule.objects.using(broker.default_alias()).values_list("name", flat=True))


def set_paused(names: Sequence[str], paused: bool, who: Operator) -> list[str]:
    """Pause or resume; a resumed schedule starts from its next occurrence after now."""
    return broker.set_schedules_paused(names, paused, who.name)


def prune(names: Sequence[str] | None = None) -> int:
    """Delete schedules no worker's code declares any more (all for None, else these; an
    empty list deletes none)."""
    return broker.prune_schedules(names)


def run_now(names: Sequence[str], who: Operator) -> dict[str, int]:
    """Enqueue one extra run of each schedule now; return name -> message id.

    Paused, removed and broken schedules run too: an operator asked for it. The schedules'
    next occurrences don't move.
    """
    made = {}
    for name in names:
        message_id = broker.run_schedule_now(name)
        if message_id is not None:
            made[name] = message_id
            logger.info("Schedule %r: %s enqueued one run now (#%s).", name, who.name,
                        message_id)
    return made
