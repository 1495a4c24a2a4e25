"""``manage.py demokill PID``: kill a running worker with SIGKILL while it holds claims."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from example_project.shop import crash, demo


class Command(BaseCommand):
    help = ("Wait until the worker process PID holds claimed messages (one of them started), "
            "kill it with SIGKILL and record it on the latest demo run, for demoreport.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("pid", type=int, help="Process id of a running runqueueworker.")
        parser.add_argument("--min-claims", type=int, default=3,
                            help="Claimed messages it must hold first (default 3).")
        parser.add_argument("--timeout", type=float, default=60.0,
                            help="Seconds to wait for that (default 60).")

    def handle(self, *args: Any, **options: Any) -> None:
        run = demo.latest_run()
        if run is None:
            raise CommandError("No demo run yet: run `manage.py enqueuedemo` first.")
        try:
            run = crash.kill_when_holding(run, options["pid"], options["min_claims"],
                                          options["timeout"])
        except crash.CrashError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"kill -9 {options['pid']} ({run.killed_worker}) while it held "
                          f"{run.killed_holding} claimed message(s)")
