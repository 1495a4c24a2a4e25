"""Argument parsing shared by the operator commands: filters, durations, progress."""

from __future__ import annotations

import contextlib
import datetime as dt
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper
from django.db import DatabaseError

from .. import ops, routing
from ..checks import SETTINGS_TAG
from ..conf import SettingsError
from ..models import CANCELLABLE_STATUSES, MessageStatus

#: Options that take a duration, each with what it is called in the error for ``-2h``.
DURATION_OPTIONS = {
    **dict.fromkeys(("--since", "--until", "--to-time"), "a duration ago"),
    **dict.fromkeys(("--older-than", "--dead-older-than", "--workers-older-than", "--delay"),
                    "a duration"),
}


def utc(moment: dt.datetime, seconds: bool = True) -> str:
    """A time in a command's text output: ``2026-11-24 08:03:11 UTC`` (as ``queueschedule``,
    ``queuepurge`` and ``queuepipeline`` print theirs; ``--json`` gives ISO 8601 with
    ``+00:00``). An aware time is shown in UTC; a naive one is the server's UTC."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S UTC}" if seconds else f"{moment:%Y-%m-%d %H:%M UTC}"


class DurationParser(CommandParser):
    """A parser that explains ``--since -2h``: argparse takes ``-2h`` for an option and says
    only "expected one argument"; this says to write ``2h``, as docs/operations.md
    promises (a one-line error that says what is accepted)."""

    given: Sequence[str] = ()

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("args")
        self.given = list(given or ())
        return super().parse_known_args(*args, **kwargs)

    def error(self, message: str) -> Any:
        for option, value in zip(self.given, self.given[1:], strict=False):
            undashed = ops.without_dash(value)
            if (option in DURATION_OPTIONS and undashed
                    and message.startswith(f"argument {option}:")):
                message = (f"argument {option}: {DURATION_OPTIONS[option]} is written without "
                           f"a dash: {option} {undashed}, not {option} {value}")
                break
        super().error(message)


def explain_dashed_durations(parser: ArgumentParser) -> None:
    """Makes ``parser`` a :class:`DurationParser`, and so the subparsers added to it after
    (Django's ``add_subparsers`` makes them of the parser's class). Called first in
    ``add_arguments``: Django's ``create_parser`` builds a CommandParser and takes no
    other class."""
    parser.__class__ = DurationParser


def _csv(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def _statuses(text: str) -> list[str]:
    statuses = _csv(text)
    unknown = sorted(set(statuses) - set(CANCELLABLE_STATUSES))
    if unknown:
        raise ArgumentTypeError(
            f"{', '.join(unknown)}: only {', '.join(CANCELLABLE_STATUSES)} messages can be "
            "changed by an operator (running ones never are; blocked and throttled ones can be "
            "cancelled, not requeued)")
    return statuses


def _requeue_statuses(text: str) -> list[str]:
    statuses = _statuses(text)
    if MessageStatus.THROTTLED in statuses:
        raise ArgumentTypeError(
            "throttled: a throttled message waits for its rate limit's next start; a "
            "requeue would not make it start sooner. Cancel it (queuecancel --status "
            "throttled) if it must not run")
    if MessageStatus.BLOCKED in statuses:
        raise ArgumentTypeError(
            "blocked: a blocked message waits for its turn (its subject's head, a slot of "
            "its concurrency key); a requeue would make it jump that order. Requeue the "
            "dead head that holds it (queuesubject requeue-head), release the subject "
            "(queuesubject release), or cancel it (queuecancel --status blocked)")
    return statuses


def _since(text: str) -> Any:
    try:
        return ops.parse_since(text)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None


def count(low: int, high: int) -> Any:
    """An argparse type: a whole number from ``low`` to ``high`` (ASCII digits only: other
    scripts' digits pass ``isdigit()`` but not ``int()``), refused saying the range."""
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
            raise ArgumentTypeError(f"expected a whole number from {low} to {high}, "
                                    f"not {text!r}")
        return int(text)
    return parse


def duration(text: str) -> Any:
    undashed = ops.without_dash(text)
    if undashed:  # --older-than=-30d
        raise ArgumentTypeError(f"expected a duration without a dash: write {undashed}, not "
                                f"{text.strip()}")
    try:
        return ops.parse_duration(text)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None


def add_filter_arguments(parser: ArgumentParser, default_status: str | None,
                         requeue: bool = False) -> None:
    parser.add_argument("--queue", type=_csv, default=[],
                        help="Only these queues (comma-separated).")
    parser.add_argument("--task", type=_csv, default=[],
                        help="Only these task names (comma-separated).")
    parser.add_argument("--status", type=_requeue_statuses if requeue else _statuses,
                        default=[default_status] if default_status else None,
                        help="Statuses to match: ready, scheduled, dead"
                             + ("" if requeue else ", blocked, throttled")
                             + " (comma-separated)"
                             + (f"; default {default_status}." if default_status else "."))
    parser.add_argument("--since", type=_since, default=None,
                        help="Only messages enqueued since then: a duration (2h, 3d) or an "
                             "ISO date/time.")
    parser.add_argument("--dry-run", action="store_true",
                        help="Say how many messages match; change nothing.")


def message_filter(options: dict[str, Any]) -> ops.MessageFilter:
    return ops.MessageFilter(queues=options["queue"], tasks=options["task"],
                             statuses=options["status"] or [], since=options["since"])


def progress_printer(stream: OutputWrapper, verb: str) -> ops.Progress:
    """Progress lines on stderr (``requeued 500/1200``), so stdout stays the result."""
    def report(done: int, total: int) -> None:
        stream.write(f"{verb} {done}/{total}")
        stream.flush()

    return report


def add_database_argument(parser: ArgumentParser) -> None:
    parser.add_argument("--database", default=None, metavar="ALIAS",
                        help="The queue database to act on (default: MYSQLQ['DATABASE']), "
                             "when queues live on several (docs/scaling.md).")


def queue_database(alias: str | None) -> str | None:
    """``--database``'s alias when it holds queues; else a CommandError naming those that
    do (not a traceback for an unknown alias, nor migrate advice for another database)."""
    if alias is not None and alias not in routing.queue_aliases():
        raise CommandError(f"--database {alias!r} holds no queue (queue databases: "
                           f"{', '.join(routing.queue_aliases())}).")
    return alias


def on_database(alias: str | None,
                queues: Sequence[str] = ()) -> contextlib.AbstractContextManager[None]:
    """This command's statements go to ``alias`` (a queue database; never a replica), or,
    without one, to the database that holds ``queues`` (the command's ``--queue``)."""
    return routing.on_alias(queue_database(_of_queues(alias, queues)))


def _of_queues(alias: str | None, queues: Sequence[str]) -> str | None:
    """``--database`` checked against the databases ``--queue``'s queues live on, or, when
    it is left out, theirs; a CommandError when they differ or are several."""
    if not queues:
        return alias
    placed = {queue: routing.alias_for_queue(queue) for queue in queues}
    if alias is not None:
        for queue, where in placed.items():
            if where != alias:
                raise CommandError(
                    f"The queue {queue!r} lives on the database {where!r}, not {alias!r} "
                    f"(--database): give --database {where}, or leave --database out.")
        return alias
    found = sorted(set(placed.values()))
    if len(found) > 1:
        raise CommandError(
            "The queues given live on several databases ("
            + "; ".join(f"{where}: {', '.join(q for q, a in placed.items() if a == where)}"
                        for where in found)
            + "): run the command once per database, with --database and its queues.")
    return found[0]


class SaysDatabaseErrors(BaseCommand):
    """An operator command. It says plainly what to do about a database error no retry can
    fix (tables missing before ``migrate``, an unknown database, a refused login or grant)
    instead of showing a traceback, and so for invalid ``MYSQLQ`` settings and a task
    module that can't be imported where a command needs the tasks.

    It runs only the system checks of the settings and of where the queues live
    (:data:`~django_mysqlq.checks.SETTINGS_TAG`: E001-E004, E010-E013), not those of the
    task code (a broken schedule, E006, or task module, E005): an operator must be able to
    pause, inspect and requeue during such an incident (``runqueueworker`` runs them all)."""

    requires_system_checks = [SETTINGS_TAG]

    def execute(self, *args: Any, **options: Any) -> Any:
        from ..worker import fatal

        try:
            return super().execute(*args, **options)
        except SettingsError as exc:
            raise CommandError(f"MYSQLQ is invalid: {exc} (manage.py check lists each "
                               "problem; docs/settings.md has every key).") from exc
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            database = options.get("database")
            problem = fatal.describe(exc, then="run this command again",
                                     database=database if isinstance(database, str) else None)
            if problem is None:
                raise
            raise CommandError(problem, returncode=fatal.EXIT_CANNOT_RUN) from exc
