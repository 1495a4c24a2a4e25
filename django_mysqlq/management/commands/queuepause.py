"""``manage.py queuepause``: stop workers claiming from queues (``--resume`` undoes it)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from django_mysqlq import broker, limits, ops
from django_mysqlq.management import cli, names
from django_mysqlq.routing import queue_aliases


class Command(cli.SaysDatabaseErrors):
    help = ("Pause queues: workers stop claiming from them within about a second; their "
            "messages stay. --resume lets workers claim again.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("queues", nargs="+", help="Queue names.")
        parser.add_argument("--resume", action="store_true", help="Resume instead of pausing.")

    def handle(self, *args: Any, **options: Any) -> None:
        for queue in options["queues"]:
            problem = limits.queue_problem(queue, "a queue name")
            if problem:
                raise CommandError(f"{queue!r} can never be a queue: {problem}")
        operator = ops.cli_operator()
        for queue in options["queues"]:
            # Read before the pause row: that row would make any name look used.
            warning = names.queue_warning(
                queue, f"{'Resumed' if options['resume'] else 'Paused'} anyway.")
            if warning:
                self.stderr.write(warning)
            broker.set_paused(queue, not options["resume"], operator)
            self.stdout.write(f"{'Resumed' if options['resume'] else 'Paused'} {queue}.")
        # Each queue is paused on its own database: list what every queue database holds.
        paused = sorted({queue for alias in queue_aliases(options["queues"])
                         for queue in broker.paused_queues(alias)})
        self.stdout.write(f"Paused now: {', '.join(paused) if paused else 'none'}.")
