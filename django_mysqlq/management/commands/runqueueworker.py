"""``manage.py runqueueworker``: parse the arguments, then hand over to the worker."""

from __future__ import annotations

import json
import logging
import sys
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from django_mysqlq.conf import LOG_FORMATS, get_settings
from django_mysqlq.exceptions import WorkerCannotRun
from django_mysqlq.topicnames import group_problem, group_queue
from django_mysqlq.worker import WorkerOptions, fatal, logsetup
from django_mysqlq.worker.databases import Workers
from django_mysqlq.worker.draining import EXIT_DEAD
from django_mysqlq.worker.queues import ALL, resolve
from django_mysqlq.worker.stats import Figures, summary_lines
from django_mysqlq.worker.supervisor import Supervisor


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _names(what: str) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of ``what`` (queue or group) names."""
    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",")]
        if not all(names):
            raise ArgumentTypeError(f"expected comma-separated {what} names, got {text!r}")
        return names
    return parse



def _check_burst_only(options: dict[str, Any]) -> None:
    """``--exit-zero`` and ``--burst-wait`` mean something only to a ``--burst`` run: without
    it they were taken and ignored, so a worker meant to drain and exit ran for ever."""
    # (``is``, not ``in (None, False)``: ``--burst-wait 0`` is 0.0, which equals False.)
    given = [option for option, taken in (("--exit-zero", options["exit_zero"] is True),
                                          ("--burst-wait", options["burst_wait"] is not None))
             if taken]
    if given and not options["burst"]:
        raise CommandError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} "
                           "--burst (drain the queues, then exit); without it the worker "
                           "runs until stopped. Add --burst, or leave "
                           f"{'it' if len(given) == 1 else 'them'} out.")


class Command(BaseCommand):
    help = "Run a worker that claims and runs queued tasks until SIGTERM/SIGINT."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--queues", type=_names("queue"), default=None,
                            help="Comma-separated queues, claimed in this order (default, "
                                 "or '*': every queue a known task uses, by name).")
        parser.add_argument("--groups", type=_names("group"), default=None,
                            help="Comma-separated consumer groups to be a member of (their "
                                 "queues group:<name> are served after --queues; without "
                                 "--queues, only these groups).")
        parser.add_argument("--concurrency", type=_positive_int, default=1,
                            help="Threads running tasks in this process (default 1).")
        parser.add_argument("--batch", type=_positive_int, default=None,
                            help="Messages claimed per statement (default MYSQLQ['BATCH_SIZE']).")
        parser.add_argument("--burst", action="store_true",
                            help=f"Drain the queues, then exit: 0, or {EXIT_DEAD} if messages "
                                 "went dead meanwhile.")
        parser.add_argument("--exit-zero", action="store_true",
                            help="With --burst, exit 0 even if messages went dead.")
        parser.add_argument("--burst-wait", type=float, default=None,
                            help="With --burst, wait for retries due within this many seconds "
                                 "(default 5).")
        parser.add_argument("--max-tasks", type=_positive_int, default=None,
                            help="Exit after claiming this many messages.")
        parser.add_argument("--processes", type=_positive_int, default=None,
                            help="Fork this many worker processes under a supervisor that "
                                 "restarts them (each with --concurrency threads).")
        parser.add_argument("--max-memory", type=_positive_int, default=None, metavar="MIB",
                            help="Replace a worker process once its resident memory passes "
                                 "this many MiB (it drains first).")
        parser.add_argument("--json-summary", action="store_true",
                            help="Print the final summary as JSON on stdout.")
        parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                            help="Format of the log handler the worker adds when LOGGING "
                                 "shows nothing of django_mysqlq: text, or json (one object "
                                 "a line). Default: MYSQLQ['LOG_FORMAT'].")

    def execute(self, *args: Any, **options: Any) -> Any:
        # The system checks connect first: a missing database or a refused login is said
        # plainly, not as a traceback.
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            problem = fatal.describe(exc)
            if problem is None:
                raise
            raise CommandError(problem, returncode=fatal.EXIT_CANNOT_RUN) from exc

    def handle(self, *args: Any, **options: Any) -> None:
        note = logsetup.configure(options["verbosity"],
                                  options["log_format"] or get_settings().LOG_FORMAT)
        if note:
            logging.getLogger("django_mysqlq").warning(note)
        try:
            self._run(options)
        except WorkerCannotRun as exc:
            raise CommandError(str(exc), returncode=exc.exit_status) from exc

    def _run(self, options: dict[str, Any]) -> None:
        _check_burst_only(options)
        try:
            queues = options["queues"]
            if options["groups"]:
                for group in options["groups"]:
                    problem = group_problem(group)
                    if problem is not None:  # a:b would be served as a queue, never a group
                        raise ValueError(f"--groups: {problem}")
                # --queues '*' --groups g: every known queue, and the group's (once).
                base = list(resolve(None)) if queues == [ALL] else list(queues or [])
                queues = [*base, *(queue for queue in dict.fromkeys(
                    group_queue(group) for group in options["groups"]) if queue not in base)]
            worker_options = WorkerOptions.build(
                queues, concurrency=options["concurrency"], batch=options["batch"],
                burst=options["burst"], max_tasks=options["max_tasks"],
                burst_wait=(WorkerOptions.burst_wait if options["burst_wait"] is None
                            else options["burst_wait"]),
                max_memory_mb=options["max_memory"], exit_zero=options["exit_zero"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["processes"] is not None:
            supervisor = Supervisor(worker_options, options["processes"])
            status = supervisor.run()
            self._summary(supervisor.figures, options["json_summary"])
        else:
            workers = Workers(worker_options)
            status = workers.run()
            self._summary(workers.figures, options["json_summary"])
        if status:
            sys.exit(status)

    def _summary(self, found: list[tuple[str, Figures]], as_json: bool) -> None:
        """The final summary on stdout: one line (one per database), or one JSON object."""
        if as_json:
            self.stdout.write(json.dumps(found[0][1] if len(found) == 1 else dict(found)))
        else:
            for line in summary_lines(found):
                self.stdout.write(f"Summary: {line}")
