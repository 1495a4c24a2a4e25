"""``manage.py queuerequeue``: make matching dead (or waiting) messages ready now."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django_mysqlq import ops
from django_mysqlq.management import cli, names


class Command(cli.SaysDatabaseErrors):
    help = ("Requeue messages matching the filters (default: every dead message). "
            "Running messages are never touched; each change is recorded in history.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        cli.explain_dashed_durations(parser)
        cli.add_database_argument(parser)
        cli.add_filter_arguments(parser, default_status="dead", requeue=True)
        parser.add_argument("--reset-attempts", action="store_true",
                            help="Give each message a full set of attempts again.")

    def handle(self, *args: Any, **options: Any) -> None:
        with cli.on_database(options["database"], options["queue"]):
            self._handle(**options)

    def _handle(self, **options: Any) -> None:
        selection = cli.message_filter(options)
        for warning in names.filter_warnings(options["queue"], options["task"]):
            self.stderr.write(warning)
        if options["dry_run"]:
            self.stdout.write(f"{ops.count_matching(selection)} message(s) would be requeued.")
            return
        done = ops.requeue_matching(selection, ops.cli_operator(),
                                    reset_attempts=options["reset_attempts"],
                                    progress=cli.progress_printer(self.stderr, "requeued"))
        self.stdout.write(f"Requeued {len(done)} message(s).")
