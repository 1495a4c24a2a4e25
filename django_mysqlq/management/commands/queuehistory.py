"""``manage.py queuehistory``: the history table's partitions (opt-in; see
docs/pipeline.md, "Partitioning the history"): ``partition``, ``partitions``,
``unpartition``. The statements are in :mod:`django_mysqlq.broker.partitions`."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from django_mysqlq import limits
from django_mysqlq.broker import partitions
from django_mysqlq.management import cli

#: MariaDB's most partitions in one table: more empty ones ahead could never be made.
MOST_PARTITIONS = 8192
COLUMNS = ("partition", "ids from", "ids below", "rows (estimate)")


class Command(cli.SaysDatabaseErrors):
    help = ("The history table (mysqlq_attempt) partitioned by id range, so that "
            "queuepipeline archive drops whole partitions instead of deleting rows: "
            "'partition' (converts it: copies the table), 'partitions' (lists them), "
            "'unpartition' (back to one table: copies it).")

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        make = sub.add_parser("partition", help="Partition the table by ranges of ids (a "
                              "copy of the table; writes wait meanwhile), or, if it is, "
                              "add empty partitions above its highest id.")
        make.add_argument("--rows-per-partition", type=cli.count(1, limits.BIGINT_MAX),
                          default=None, metavar="N",
                          help="Ids per partition (needed to convert; default then: the "
                               "last partition's width).")
        make.add_argument("--ahead", type=cli.count(1, MOST_PARTITIONS),
                          default=partitions.KEEP_AHEAD, metavar="K",
                          help="Empty partitions to keep above the highest id "
                               f"(default {partitions.KEEP_AHEAD}).")
        cli.add_database_argument(make)
        listing = sub.add_parser("partitions", help="The partitions: id bounds, row estimates.")
        listing.add_argument("--json", action="store_true")
        cli.add_database_argument(listing)
        undo = sub.add_parser("unpartition", help="Back to one table (a copy of the table).")
        cli.add_database_argument(undo)

    def handle(self, *args: Any, **options: Any) -> None:
        with cli.on_database(options["database"]):
            try:
                getattr(self, f"do_{options['action']}")(options)
            except partitions.PartitionError as exc:
                raise CommandError(str(exc)) from None

    def do_partition(self, options: dict[str, Any]) -> None:
        width = options["rows_per_partition"]
        if width is None and partitions.layout() is None:
            raise CommandError("--rows-per-partition N is needed to partition the table.")
        def progress(line: str) -> None:
            self.stderr.write(line)

        if width is not None:
            change = partitions.partition(width, ahead=options["ahead"], progress=progress)
        else:
            change = partitions.keep_ahead(ahead=options["ahead"], copy=True,
                                           progress=progress)
        if change.added:
            copied = f" (copied the rows of up to {change.copied} ids)" if change.copied else ""
            self.stdout.write(f"Added partitions {', '.join(change.added)}{copied}.")
        else:
            self.stdout.write(f"Nothing to do: {change.skipped}.")

    def do_partitions(self, options: dict[str, Any]) -> None:
        found = partitions.layout()
        if options["json"]:
            self.stdout.write(json.dumps(None if found is None else [
                {"partition": p.name, "low": p.low, "high": p.high,
                 "rows_estimate": p.rows_estimate} for p in found]))
            return
        if found is None:
            self.stdout.write("mysqlq_attempt is not partitioned (queuehistory partition "
                              "--rows-per-partition N partitions it).")
            return
        rows = [COLUMNS, *((p.name, str(p.low), "-" if p.high is None else str(p.high),
                            str(p.rows_estimate)) for p in found)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in
                                        zip(row, widths, strict=True)).rstrip())

    def do_unpartition(self, options: dict[str, Any]) -> None:
        done = partitions.unpartition()
        self.stdout.write("mysqlq_attempt is one table again." if done
                          else "mysqlq_attempt was not partitioned.")
