"""``manage.py queuecancel``: delete matching waiting or dead messages (history keeps them)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from django_mysqlq import ops
from django_mysqlq.management import cli, names
from django_mysqlq.models import CANCELLABLE_STATUSES


class Command(cli.SaysDatabaseErrors):
    help = ("Cancel messages matching the filters. --status is required, so a bare command "
            "never empties the queue. Running messages are never touched.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        cli.explain_dashed_durations(parser)
        cli.add_database_argument(parser)
        cli.add_filter_arguments(parser, default_status=None)

    def handle(self, *args: Any, **options: Any) -> None:
        with cli.on_database(options["database"], options["queue"]):
            self._handle(**options)

    def _handle(self, **options: Any) -> None:
        if not options["status"]:
            raise CommandError(f"Say which messages to cancel with --status "
                               f"({', '.join(CANCELLABLE_STATUSES)}; comma-separated), e.g. "
                               "--status dead --task app.send.")
        selection = cli.message_filter(options)
        for warning in names.filter_warnings(options["queue"], options["task"]):
            self.stderr.write(warning)
        if options["dry_run"]:
            self.stdout.write(f"{ops.count_matching(selection)} message(s) would be cancelled.")
            return
        done = ops.cancel_matching(selection, ops.cli_operator(),
                                   progress=cli.progress_printer(self.stderr, "cancelled"))
        self.stdout.write(f"Cancelled {len(done)} message(s).")
