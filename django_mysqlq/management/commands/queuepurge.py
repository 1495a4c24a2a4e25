"""``manage.py queuepurge``: retention of history, dead messages and worker rows, in short
batches."""

from __future__ import annotations

import datetime as dt
from argparse import ArgumentParser, ArgumentTypeError
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from django_mysqlq import broker, ops
from django_mysqlq.management import cli


def _batch(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100_000:
        raise ArgumentTypeError(f"expected a whole number from 1 to 100000, not {text!r}")
    return int(text)


#: option -> (what it deletes, the broker's count of it, as the output names it).
_KINDS: dict[str, tuple[str, Callable[[dt.datetime], int]]] = {
    "older_than": ("history row(s) finished", broker.count_history_before),
    "dead_older_than": ("dead message(s) that died", broker.count_dead_before),
    "workers_older_than": ("stopped worker row(s) last heard from",
                           broker.count_workers_before),
}


class Command(cli.SaysDatabaseErrors):
    help = ("Delete history rows, dead messages and stopped workers' rows older than the "
            "given ages, oldest first, in autocommit batches that each hold their locks "
            "only briefly.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        cli.explain_dashed_durations(parser)
        cli.add_database_argument(parser)
        parser.add_argument("--older-than", type=cli.duration,
                            help="Delete history rows that finished longer ago: 30d, 12h, "
                                 "2w ...")
        parser.add_argument("--dead-older-than", type=cli.duration,
                            help="Delete dead messages that died longer ago; history keeps "
                                 "each as 'cancelled', with its arguments.")
        parser.add_argument("--workers-older-than", type=cli.duration,
                            help="Delete rows of stopped workers last heard from longer ago.")
        parser.add_argument("--batch-size", type=_batch, default=1000,
                            help="Rows per DELETE (default 1000).")
        parser.add_argument("--dry-run", action="store_true",
                            help="Say how many rows would go; delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        with cli.on_database(options["database"]):
            self._handle(**options)

    def _handle(self, **options: Any) -> None:
        given = [kind for kind in _KINDS if options[kind] is not None]
        if not given:
            raise CommandError("Give at least one of --older-than (history), "
                               "--dead-older-than (dead messages) or --workers-older-than "
                               "(stopped workers' rows), e.g. --older-than 30d.")
        if options["dry_run"]:
            now = broker.database_now()
            for kind in given:
                what, count = _KINDS[kind]
                before = now - options[kind]
                self.stdout.write(f"{count(before)} {what} before {before:%Y-%m-%d %H:%M} "
                                  "UTC would be deleted.")
            return
        batch = options["batch_size"]
        if options["older_than"] is not None:
            deleted = ops.purge_history(options["older_than"], batch=batch,
                                        progress=cli.progress_printer(self.stderr, "deleted"))
            self.stdout.write(f"Deleted {deleted} history row(s).")
        if options["dead_older_than"] is not None:
            deleted = ops.purge_dead(
                options["dead_older_than"], ops.cli_operator(), batch=batch,
                progress=cli.progress_printer(self.stderr, "deleted dead"))
            self.stdout.write(f"Deleted {deleted} dead message(s); history keeps each as "
                              "'cancelled', with its arguments.")
        if options["workers_older_than"] is not None:
            deleted = ops.purge_workers(
                options["workers_older_than"], batch=batch,
                progress=cli.progress_printer(self.stderr, "deleted workers"))
            self.stdout.write(f"Deleted {deleted} worker row(s).")
