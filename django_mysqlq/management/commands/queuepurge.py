"""``manage.py queuepurge``: history retention, in short batches."""

from __future__ import annotations

from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand

from django_mysqlq import broker, ops
from django_mysqlq.management import cli


def _batch(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100_000:
        raise ArgumentTypeError(f"expected a whole number from 1 to 100000, not {text!r}")
    return int(text)


class Command(BaseCommand):
    help = ("Delete history rows that finished longer ago than --older-than, oldest first, "
            "in autocommit batches that each hold their locks only briefly.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--older-than", type=cli.duration, required=True,
                            help="Age of the rows to delete: 30d, 12h, 2w ...")
        parser.add_argument("--batch-size", type=_batch, default=1000,
                            help="Rows per DELETE (default 1000).")
        parser.add_argument("--dry-run", action="store_true",
                            help="Say how many rows would go; delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["dry_run"]:
            before = broker.database_now() - options["older_than"]
            count = broker.count_history_before(before)
            self.stdout.write(f"{count} history row(s) finished before {before:%Y-%m-%d %H:%M} "
                              "UTC would be deleted.")
            return
        deleted = ops.purge_history(options["older_than"], batch=options["batch_size"],
                                    progress=cli.progress_printer(self.stderr, "deleted"))
        self.stdout.write(f"Deleted {deleted} history row(s).")
