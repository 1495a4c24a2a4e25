"""``manage.py demoreport``: what happened to a demo run, read from the queue tables."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_mysqlq.models import MessageStatus, Outcome
from example_project.shop import crash, demo
from example_project.shop.models import DemoRun

OUTCOMES = (Outcome.SUCCEEDED, Outcome.RETRIED, Outcome.FAILED, Outcome.LOST, Outcome.CANCELLED)


class Command(BaseCommand):
    help = "Summarise a demo run from the queue's history (Attempt) and hot (Message) tables."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--run", type=int, default=None,
                            help="Demo run id (default: the latest run).")
        parser.add_argument("--check", action="store_true",
                            help="Exit with an error if the queue and the shop disagree.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["run"] is None:
            run = demo.latest_run()
            if run is None:
                raise CommandError("No demo run yet: run `manage.py enqueuedemo` first.")
        else:
            try:
                run = DemoRun.objects.get(pk=options["run"])
            except DemoRun.DoesNotExist:
                raise CommandError(f"No demo run {options['run']}.") from None
        report = demo.build_report(run)
        self._print(report)
        if report.problems:
            for problem in report.problems:
                self.stderr.write(f"PROBLEM: {problem}")
            if options["check"]:
                raise CommandError(f"{len(report.problems)} consistency problem(s) in demo "
                                   f"run {run.pk}.")
        else:
            self.stdout.write("Consistency: OK (every order is paid with an invoice or "
                              "payment_failed with a dead charge; every event recorded; "
                              "nothing the killed worker held was lost).")

    def _print(self, report: demo.Report) -> None:
        out = self.stdout.write
        o = report.outcomes
        out(f"Demo run {report.run.pk} ({report.run.orders} orders, started "
            f"{report.run.started_at:%Y-%m-%d %H:%M:%S} UTC)")
        out(f"Attempts: succeeded={o[Outcome.SUCCEEDED]} retried={o[Outcome.RETRIED]} "
            f"failed(dead)={o[Outcome.FAILED]} lost={o[Outcome.LOST]} "
            f"cancelled={o[Outcome.CANCELLED]}")
        out(f"  {'task':<20}" + "".join(f"{k.value:>11}" for k in OUTCOMES) + f"{'avg ms':>9}")
        for line in report.tasks:
            avg = "-" if line.avg_ms is None else f"{line.avg_ms:.1f}"
            out(f"  {line.task:<20}" + "".join(f"{line.outcomes[k]:>11}" for k in OUTCOMES)
                + f"{avg:>9}")
        remaining = " ".join(f"{status}={report.remaining[status]}"
                             for status in MessageStatus.values)
        out(f"Messages left in the queue: {remaining}")
        for message_id, task, error in report.dead_examples:
            out(f"  dead #{message_id} {task}: {error}")
        out(f"Rate: {report.rate:.1f} succeeded attempts/s over {report.seconds:.2f}s "
            "(first start to last finish)")
        orders = " ".join(f"{status}={count}" for status, count in sorted(report.orders.items()))
        events = " ".join(f"{kind}={count}" for kind, count in sorted(report.events.items()))
        out(f"Shop: orders {orders}; invoices={report.invoices}")
        out(f"      events {events}; recorded more than once={report.repeated_events}")
        if report.recovery is not None:
            self._print_recovery(report.recovery)

    def _print_recovery(self, r: crash.Recovery) -> None:
        out = self.stdout.write
        out(f"kill -9: worker {r.worker} at {r.killed_at:%H:%M:%S.%f} UTC, holding "
            f"{r.holding} claimed message(s), {r.started} of them started")
        if not r.recovered_after:
            out("  recovered: none")
            return
        out(f"  recovered by its peers: {len(r.recovered_after)} message(s), "
            f"{r.fastest:.1f}-{r.slowest:.1f}s after the kill (a 'lost' attempt each; "
            f"{r.started} spent an attempt, {len(r.recovered_after) - r.started} got theirs "
            "back)")
        rerun = ", ".join(f"{worker} ({count})" for worker, count in sorted(r.rerun_by.items()))
        out(f"  run again by: {rerun or 'nobody yet'}; unfinished: {len(r.unfinished)}")
