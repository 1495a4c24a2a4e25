"""Cron expressions in a time zone: validation, occurrences, and what a catch-up fires.

Parsing and iteration come from ``croniter`` (five fields, or six with seconds last, and
the ``@daily``-style aliases); this module adds the time zone, the daylight-saving rules
and the catch-up policies, and works in aware UTC datetimes at its edges. It imports
nothing of the package but ``limits``: the decorator, the settings and the broker use it.

Daylight saving, in a zone that has it (tested in America/New_York):

* a wall time that does not exist on a spring-forward day (``30 2 * * *``) fires once,
  at the first minute after the gap (03:00): croniter's rule, kept;
* a wall time that happens twice on a fall-back day (``30 1 * * *``) fires once, at its
  first (daylight) instant, unless the hour field is ``*``: a schedule that runs every
  hour (``0 * * * *``, ``*/15 * * * *``) runs in both hours, since they are distinct
  hours of real time. That is the rule of the classic cron daemons.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import zoneinfo
from typing import Any

from croniter import CroniterBadDateError, CroniterError, croniter

from . import limits

SKIP, LATEST, ALL = "skip", "latest", "all"
CATCH_UP_POLICIES = (SKIP, LATEST, ALL)
#: Most missed occurrences ``catch_up="all"`` enqueues at once; older ones are dropped.
CATCH_UP_LIMIT = 1000
#: Longest cron expression and time zone name (the schedule table's columns).
EXPRESSION_MAX = 255
ZONE_MAX = 64
SECOND = dt.timedelta(seconds=1)


class CronError(ValueError):
    """An expression or a zone that can't be used; the message says why."""


def expression_problem(expression: object, option: str = "cron") -> str | None:
    """Why ``expression`` is not a usable cron expression, or None."""
    if not isinstance(expression, str) or not expression.strip() \
            or len(expression) > EXPRESSION_MAX or not limits.is_utf8(expression):
        return (f"{option} must be a cron expression of at most {EXPRESSION_MAX} characters "
                f"(five fields, e.g. '*/5 * * * *', or six with seconds last), not "
                f"{expression!r}.")
    if len(expression.split()) > 6:
        # (croniter takes a seventh field, a year: such a schedule runs out of
        # occurrences, and its next one could no longer be known after the last.)
        return (f"{option} {expression!r} has {len(expression.split())} fields; use five "
                "(minute hour day-of-month month day-of-week), or six with seconds last, "
                "e.g. '*/5 * * * *' or '0 3 * * mon-fri'. A year field is not supported.")
    try:
        iterator = croniter(expression, dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        iterator.get_next(dt.datetime)
    except CroniterBadDateError:
        return f"{option} {expression!r} never fires (no date matches it)."
    except (CroniterError, ValueError, KeyError, IndexError, TypeError) as exc:
        return (f"{option} {expression!r} is not a valid cron expression ({exc}); use five "
                "fields (minute hour day-of-month month day-of-week), or six with seconds "
                "last, e.g. '*/5 * * * *' or '0 3 * * mon-fri'.")
    return None


def zone_problem(name: object, option: str = "cron_tz") -> str | None:
    """Why ``name`` is not an IANA time zone this machine knows, or None."""
    if not isinstance(name, str) or not name or len(name) > ZONE_MAX:
        return (f"{option} must be an IANA time zone name such as 'Europe/Paris' or 'UTC' "
                f"(at most {ZONE_MAX} characters), not {name!r}.")
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        # (OSError: a folder of the tzdata package, 'America' or 'Etc', is no zone: its
        # open raises IsADirectoryError.)
        return (f"{option} {name!r} is not a time zone this machine knows; use an IANA name "
                "such as 'Europe/Paris' or 'UTC' (on Windows, pip install tzdata).")
    return None


def catch_up_problem(value: object, option: str = "catch_up") -> str | None:
    if value in CATCH_UP_POLICIES:
        return None
    return (f"{option} must be one of {', '.join(map(repr, CATCH_UP_POLICIES))} (what a "
            f"schedule does about occurrences missed while no worker ran), not {value!r}.")


def _utc(value: dt.datetime) -> dt.datetime:
    """An aware UTC datetime; a naive one is taken as UTC (the database's times)."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _whole_second(value: dt.datetime) -> dt.datetime:
    return value.replace(microsecond=0)


@dataclasses.dataclass(frozen=True)
class Cron:
    """One expression in one zone. Build it with :meth:`parse`."""

    expression: str
    zone: zoneinfo.ZoneInfo
    #: The hour field is ``*``: the repeated hour of a fall-back day runs too.
    every_hour: bool

    @classmethod
    def parse(cls, expression: str, zone: str) -> Cron:
        problem = expression_problem(expression) or zone_problem(zone, "time zone")
        if problem:
            raise CronError(problem)
        fields: Any = croniter(expression).expanded
        return cls(expression, zoneinfo.ZoneInfo(zone), fields[1] == ["*"])

    def _repeat(self, local: dt.datetime) -> bool:
        """Whether ``local`` is the second pass of a wall time a fall-back day repeats."""
        wall = local.replace(tzinfo=None)
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(dt.UTC)
        second = wall.replace(tzinfo=self.zone, fold=1).astimezone(dt.UTC)
        return first != second and local.astimezone(dt.UTC) == second

    def _keep(self, local: dt.datetime) -> bool:
        return self.every_hour or not self._repeat(local)

    def after(self, moment: dt.datetime) -> dt.datetime:
        """The first occurrence strictly after ``moment`` (UTC). One that has none (an
        expression stored by hand or by an older version that runs out) is a
        :class:`CronError`, the schedule's own: it stops that schedule, not the upkeep."""
        iterator = croniter(self.expression, _utc(moment).astimezone(self.zone))
        while True:
            try:
                local: dt.datetime = iterator.get_next(dt.datetime)
            except CroniterBadDateError:
                raise CronError(f"cron {self.expression!r} has no occurrence after "
                                f"{_utc(moment).isoformat()}: it never fires again.") from None
            if self._keep(local):
                return local.astimezone(dt.UTC)

    def between(self, start: dt.datetime, end: dt.datetime, limit: int) -> list[dt.datetime]:
        """Occurrences from ``start`` to ``end`` (both included, UTC), at most ``limit``."""
        found: list[dt.datetime] = []
        moment = _whole_second(_utc(start)) - SECOND
        if moment + SECOND < _utc(start):
            moment += SECOND  # ``start`` has a fraction: its whole second is before it
        while len(found) < limit:
            moment = self.after(moment)
            if moment > _utc(end):
                break
            found.append(moment)
        return found

    def back_from(self, end: dt.datetime, count: int) -> dt.datetime | None:
        """The ``count``-th occurrence counting back from ``end`` (included), or None.

        Only an anchor for :meth:`between`, which gives the occurrences themselves: it
        saves walking forward through a long downtime one occurrence at a time.
        """
        iterator = croniter(self.expression,
                            (_whole_second(_utc(end)) + SECOND).astimezone(self.zone))
        found: dt.datetime | None = None
        for _ in range(count):
            try:
                found = iterator.get_prev(dt.datetime).astimezone(dt.UTC)
            except CroniterBadDateError:
                return None
        return found


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one check of a due schedule does."""

    #: Occurrences to enqueue now, oldest first (UTC).
    fire: list[dt.datetime]
    #: The schedule's next occurrence after this check: strictly after ``now``.
    next_run_at: dt.datetime
    #: Occurrences missed (older than the grace period when found due), those of them not
    #: enqueued, and whether the count stopped at the limit (there were more, dropped).
    missed: int = 0
    dropped: int = 0
    dropped_capped: bool = False
    #: The oldest occurrence that was pending, for the log line.
    pending_from: dt.datetime | None = None


def plan(cron: Cron, pending_from: dt.datetime | None, now: dt.datetime, policy: str,
         grace: float, limit: int = CATCH_UP_LIMIT) -> Plan:
    """Which occurrences to enqueue for a schedule whose first unfired occurrence is
    ``pending_from`` (None: unknown, as for a row whose time was wiped), at ``now``.

    An occurrence at most ``grace`` seconds old is on time and always enqueued. Older
    ones were missed (no worker ran): ``skip`` enqueues none of them, ``latest`` the most
    recent one, ``all`` every one, the most recent ``limit`` of them at most.
    """
    now = _utc(now)
    following = cron.after(now)
    if pending_from is None:
        return Plan([], following)
    pending_from = _utc(pending_from)
    cutoff = now - dt.timedelta(seconds=grace)
    on_time = cron.between(max(pending_from, cutoff + dt.timedelta(microseconds=1)), now,
                           limit)
    wanted = {SKIP: 0, LATEST: 1, ALL: limit}[policy]
    # The missed occurrences worth walking: at most ``limit`` + 1 back from the cutoff.
    anchor = cron.back_from(cutoff, limit + 1) if pending_from <= cutoff else None
    start = pending_from if anchor is None or anchor < pending_from else anchor
    missed = cron.between(start, cutoff, limit + 1) if pending_from <= cutoff else []
    capped = anchor is not None and anchor > pending_from
    if len(missed) > limit:
        missed = missed[-limit:]
        capped = True
    fire = (missed[-wanted:] if wanted else []) + on_time
    return Plan(fire, following, missed=len(missed),
                dropped=len(missed) - min(wanted, len(missed)),
                dropped_capped=capped, pending_from=pending_from)


@dataclasses.dataclass(frozen=True)
class CronSchedule:
    """A recurring task as declared: ``@queue_task(cron=...)`` or ``MYSQLQ['SCHEDULES']``."""

    cron: str
    #: IANA zone the expression is read in.
    tz: str
    catch_up: str = SKIP
    #: The fixed arguments each occurrence's message carries (JSON, checked when declared).
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def default_zone() -> str:
    """``settings.TIME_ZONE``, or UTC when it is unset."""
    from django.conf import settings

    return getattr(settings, "TIME_ZONE", None) or "UTC"


def declare(where: str, cron: object, tz: object, catch_up: object, args: object,
            kwargs: object) -> CronSchedule:
    """Check a schedule's options; raise :class:`CronError` naming ``where`` and the problem.

    The arguments' fit to the function and their JSON are checked by the caller, which
    knows the function.
    """
    zone = default_zone() if tz is None else tz
    problem = (expression_problem(cron) or zone_problem(zone)
               or catch_up_problem(catch_up))
    if problem is None and not isinstance(args, list | tuple):
        problem = f"cron_args must be a list or tuple of arguments, not {args!r}."
    if problem is None and kwargs is not None and not (
            isinstance(kwargs, dict) and all(isinstance(key, str) for key in kwargs)):
        problem = f"cron_kwargs must be a dict with str keys, not {kwargs!r}."
    if problem:
        raise CronError(f"{where}: {problem}")
    assert isinstance(cron, str) and isinstance(zone, str) and isinstance(catch_up, str)
    assert isinstance(args, list | tuple) and (kwargs is None or isinstance(kwargs, dict))
    return CronSchedule(cron.strip(), zone, catch_up, tuple(args), dict(kwargs or {}))
