"""``manage.py queuepipeline <job>``: the Spark data pipeline (report, archive, enqueue,
replay). Parses and checks the options, then calls :mod:`django_mysqlq.contrib.spark`."""

from __future__ import annotations

import json
from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connections

from django_mysqlq import ops, routing
from django_mysqlq.conf import get_settings
from django_mysqlq.contrib import spark as pipeline
from django_mysqlq.management import cli
from django_mysqlq.models import Outcome

JOBS = ("report", "archive", "enqueue", "replay")


def _kwargs(text: str) -> dict[str, str]:
    pairs = {}
    for item in text.split(","):
        name, sep, column = (part.strip() for part in item.partition("="))
        if not sep or not name or not column:
            raise ArgumentTypeError(f"expected NAME=COLUMN,… e.g. user_id=id, not {text!r}")
        pairs[name] = column
    return pairs


def _sources(text: str) -> list[str]:
    names = cli._csv(text)
    wrong = [name for name in names if name not in ("history", "topics")]
    if wrong or not names:
        raise ArgumentTypeError(f"expected history, topics or history,topics, not {text!r}")
    return names


def _priority(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ArgumentTypeError(f"expected an integer from -100 to 100, not {text!r}") from None


class Command(cli.SaysDatabaseErrors):
    help = ("The data pipeline on Spark: report (analytics), archive (history to Parquet), "
            "enqueue (a message per row of a dataset) and replay (history to new "
            "messages). Needs the spark extra: pip install 'django-mysqlq[spark]'.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        cli.explain_dashed_durations(parser)
        shared = ArgumentParser(add_help=False)
        shared.add_argument("--master", default="local[*]",
                            help="Spark master URL (default local[*]; spark://…, yarn, k8s://…)")
        shared.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                            help="A Spark setting, repeatable: --conf spark.executor.memory=4g")
        shared.add_argument("--database", default=None, metavar="ALIAS",
                            help="The DATABASES alias to read and write (default: the "
                                 "queue's own: MYSQLQ['QUEUES'][q]['DATABASE'], a router, "
                                 "else MYSQLQ['DATABASE'])")
        shared.add_argument("--max-connections", type=cli.count(1, 1000), default=None,
                            help="Most database connections at once (default "
                                 "MYSQLQ['SPARK_MAX_CONNECTIONS'])")
        shared.add_argument("--partition-rows", type=cli.count(1000, 100_000_000), default=None,
                            help="Ids per read partition (default "
                                 "MYSQLQ['SPARK_PARTITION_ROWS'])")
        jobs = parser.add_subparsers(dest="job", required=True, metavar="JOB")

        report = jobs.add_parser("report", parents=[shared],
                                 help="Analytics over a window, into --output")
        self._window(report, "Report history that finished")
        report.add_argument("--queue", type=cli._csv, default=[], help="Only these queues")
        report.add_argument("--task", type=cli._csv, default=[], help="Only these tasks")
        report.add_argument("--archive", metavar="PATH",
                            help="Also read the Parquet archive written by archive --to PATH")
        report.add_argument("--all-databases", action="store_true",
                            help="Report the live history of every database that holds "
                                 "queues together (summary.json: by_database)")
        report.add_argument("--output", required=True, metavar="DIR",
                            help="Where summary.json, report.html and the datasets go")

        archive = jobs.add_parser("archive", parents=[shared],
                                  help="Move old history (or topic messages) to Parquet, "
                                       "then delete it")
        archive.add_argument("--older-than", type=cli.duration, required=True,
                             help="Archive history that finished (topic messages published) "
                                  "longer ago: 30d, 12h, 2w")
        archive.add_argument("--source", type=_sources, default=["history"],
                             metavar="history,topics",
                             help="What to archive: history (default), topics (messages "
                                  "every consumer group has passed), or both")
        archive.add_argument("--to", required=True, metavar="PATH",
                             help="Archive root: a local path or a Hadoop URI (s3a://…)")
        archive.add_argument("--dry-run", action="store_true",
                             help="Print what would move; change nothing")
        archive.add_argument("--include-dead", action="store_true",
                             help="Also archive messages dead since before the cut-off")
        archive.add_argument("--batch-rows", type=cli.count(1, 100_000_000), default=200_000,
                             help="Ids per archive batch (default 200000)")
        archive.add_argument("--delete-batch", type=cli.count(1, 100_000), default=2000,
                             help="Rows per DELETE statement (default 2000)")

        enqueue = jobs.add_parser("enqueue", parents=[shared],
                                  help="Enqueue a task once per row of a dataset")
        enqueue.add_argument("--task", required=True, help="A registered task's name")
        source = enqueue.add_mutually_exclusive_group(required=True)
        source.add_argument("--input", metavar="PATH",
                            help="Parquet, CSV (with a header) or JSON lines")
        source.add_argument("--query", metavar="SQL",
                            help="A SELECT on the --database, read over JDBC")
        enqueue.add_argument("--format", choices=("parquet", "csv", "json"),
                             help="The --input format (default: from its extension)")
        enqueue.add_argument("--args", type=cli._csv, default=[], metavar="COL,COL…",
                             dest="arg_columns",
                             help="Columns of the positional arguments, in order")
        enqueue.add_argument("--kwargs", type=_kwargs, default={}, metavar="NAME=COL,…",
                             dest="kwarg_columns",
                             help="Keyword arguments from columns")
        enqueue.add_argument("--queue", help="Queue (default: the task's)")
        enqueue.add_argument("--priority", type=_priority, help="-100..100 (default: the task's)")
        enqueue.add_argument("--delay", type=cli.duration, default=None,
                             help="Run this long after enqueue: 90s, 15m, 2h")
        enqueue.add_argument("--dedup-column", metavar="COL",
                             help="The row's identity for the dedup key (default: its "
                                  "arguments)")

        replay = jobs.add_parser("replay", parents=[shared],
                                 help="Enqueue again the messages a filter picks")
        self._window(replay, "Replay messages whose final row finished")
        replay.add_argument("--task", type=cli._csv, default=[], help="Only these tasks")
        replay.add_argument("--queue", type=cli._csv, default=[], help="Only these queues")
        replay.add_argument("--outcome", type=cli._csv, default=[Outcome.FAILED.value],
                            help="Final outcomes to replay: failed (default), succeeded, "
                                 "cancelled")
        replay.add_argument("--error-class", type=cli._csv, default=[],
                            help="Only messages whose final row has these error classes, "
                                 "as stored (builtins.TimeoutError) or by their last part "
                                 "(TimeoutError)")
        replay.add_argument("--archive", metavar="PATH",
                            help="Also read the Parquet archive at PATH")
        replay.add_argument("--dry-run", action="store_true",
                            help="Print the count and a sample; enqueue nothing")

    @staticmethod
    def _window(parser: ArgumentParser, what: str) -> None:
        parser.add_argument("--since", type=cli._since, default=None,
                            help=f"{what} since then: a duration ago (2h, 7d) or an ISO "
                                 "date/time (UTC without an offset)")
        parser.add_argument("--until", type=cli._since, default=None,
                            help="… and before then (default: now)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not pipeline.available():
            raise CommandError(pipeline.INSTALL_HINT)
        from django_mysqlq.contrib.spark.session import parse_conf

        if options["job"] == "enqueue" and options["partition_rows"] is not None:
            raise CommandError("--partition-rows splits reads of the queue tables (report, "
                               "archive, replay); enqueue reads its --input or --query as "
                               "Spark splits it. Leave it out, or repartition the input.")
        _connect_first(options)
        try:
            conf = parse_conf(options["conf"])
            before = _active_session()
            session = pipeline.build_session(master=options["master"], conf=conf)
            try:
                getattr(self, f"_{options['job']}")(session, options)
            finally:
                if before is None:
                    session.stop()
        except pipeline.PipelineError as exc:
            raise CommandError(str(exc)) from exc

    def _common(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"database_alias": options["database"],
                "max_connections": options["max_connections"]}

    def _report(self, session: Any, options: dict[str, Any]) -> None:
        result = pipeline.report(session, options["output"], since=options["since"],
                                 until=options["until"], queues=options["queue"],
                                 tasks=options["task"], archive=options["archive"],
                                 partition_rows=options["partition_rows"],
                                 all_databases=options["all_databases"],
                                 **self._common(options))
        self.stdout.write(result.text)
        self.stdout.write(f"Wrote {options['output']}: summary.json, report.html and the "
                          f"datasets {', '.join(result.summary['datasets'])}.")
        if options["all_databases"]:
            for row in result.summary["by_database"]:
                self.stdout.write(f"  database {row['database']}: {row['attempts']} "
                                  f"attempt(s), {row['failed']} failed")

    def _archive(self, session: Any, options: dict[str, Any]) -> None:
        result = pipeline.archive(
            session, options["to"], options["older_than"], include_dead=options["include_dead"],
            sources=options["source"], dry_run=options["dry_run"], batch_rows=options["batch_rows"],
            delete_batch=options["delete_batch"], partition_rows=options["partition_rows"],
            progress=lambda line: self.stderr.write(line), **self._common(options))
        cutoff = f"{result.cutoff:%Y-%m-%d %H:%M:%S} UTC"
        if result.dry_run:
            for kind, rows in result.rows.items():
                self.stdout.write(f"{rows} {kind} row(s) {_when(kind)} before {cutoff} would "
                                  f"move to {options['to']}.")
            if result.dropped:
                self.stdout.write(
                    f"{result.rows_in_dropped} of the history rows are in partition(s) "
                    f"{', '.join(result.dropped)}, which would be dropped whole; "
                    f"{result.rows.get('history', 0) - result.rows_in_dropped} would be "
                    "deleted row by row.")
            committed, staged = result.pending
            if committed or staged:
                self.stdout.write(f"An interrupted run left {len(committed)} committed "
                                  f"batch(es) to finish and {len(staged)} staged one(s) to "
                                  "drop; the next run does that first.")
            return
        for kind, rows in result.rows.items():
            self.stdout.write(f"Archived {rows} {kind} row(s) {_when(kind)} before {cutoff} to "
                              f"{options['to']}; deleted {result.deleted.get(kind, 0)} from "
                              f"the database, in {result.seconds:.1f}s.")
        if result.dropped or result.not_dropped:
            kept = ", ".join(f"{name} ({why})" for name, why in result.not_dropped.items())
            self.stdout.write(f"Dropped partition(s) {', '.join(result.dropped) or 'none'}"
                              + (f"; rows deleted one by one instead in {kept}" if kept
                                 else "") + ".")
        self.stdout.write("Seconds per step: " + ", ".join(
            f"{step} {seconds:.1f}" for step, seconds in result.timings.items()))
        if result.recovered.finished or result.recovered.dropped:
            self.stdout.write(f"Finished {len(result.recovered.finished)} batch(es) of an "
                              f"interrupted run ({result.recovered.deleted} rows deleted).")

    def _enqueue(self, session: Any, options: dict[str, Any]) -> None:
        from django_mysqlq.contrib.spark.fanout import read_input, read_query
        if options["input"]:
            frame = read_input(session, options["input"], options["format"])
        else:
            frame = read_query(session, options["query"], options["database"])
        delay = options["delay"].total_seconds() if options["delay"] else 0.0
        result = pipeline.enqueue(
            frame, options["task"], args=options["arg_columns"], kwargs=options["kwarg_columns"],
            queue=options["queue"], priority=options["priority"], delay=delay,
            dedup_column=options["dedup_column"], **self._common(options))
        self.stdout.write(f"Enqueued {result.enqueued} message(s) of {options['task']} from "
                          f"{result.rows} row(s) in {result.seconds:.1f}s; "
                          f"{result.duplicates} already pending (same dedup key).")
        if result.bad_rows:
            raise CommandError(f"{result.bad_rows} row(s) were not enqueued: their values "
                               f"can't be task arguments. First: {result.bad_sample}")

    def _replay(self, session: Any, options: dict[str, Any]) -> None:
        result = pipeline.replay(
            session, tasks=options["task"], queues=options["queue"],
            outcomes=options["outcome"], error_classes=options["error_class"],
            since=options["since"], until=options["until"], archive=options["archive"],
            dry_run=options["dry_run"], operator=ops.cli_operator(),
            partition_rows=options["partition_rows"], **self._common(options))
        fresh = result.matched - result.already_replayed
        if result.dry_run:
            self.stdout.write(f"{fresh} message(s) would be replayed ({result.matched} "
                              f"matched, {result.already_replayed} replayed before).")
            for row in result.sample:
                self.stdout.write("  " + json.dumps(row, default=str))
            return
        self.stdout.write(f"Replayed {result.enqueued} message(s) ({result.matched} matched, "
                          f"{result.already_replayed} replayed before) in "
                          f"{result.seconds:.1f}s.")


def _when(kind: str) -> str:
    return {"history": "finished", "dead": "died", "topics": "published"}.get(kind, "")


def _connect_first(options: dict[str, Any]) -> None:
    """Connect to the job's database(s) before Spark starts: a refused login or a missing
    database is then said in one line (``SaysDatabaseErrors``), not after a JVM's start-up
    output, and no session is started for nothing."""
    aliases = (routing.queue_aliases() if options.get("all_databases")
               else [options["database"] or get_settings().DATABASE])
    for alias in aliases:
        if alias in settings.DATABASES:  # else the job says which aliases exist
            connections[alias].ensure_connection()


def _active_session() -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()
