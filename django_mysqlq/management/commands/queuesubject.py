"""``manage.py queuesubject``: look at an ordered subject, release it or requeue its head."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from django_mysqlq import ops
from django_mysqlq.conf import get_settings
from django_mysqlq.management import cli


class Command(cli.SaysDatabaseErrors):
    help = ("Show an ordered subject (or, with --concurrency-key, a concurrency key): its "
            "counters and the messages holding it. 'release' lets the subject go on past "
            "its dead head (which stays dead); 'requeue-head' runs that head again first.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        cli.add_database_argument(parser)
        parser.add_argument("action", choices=("show", "release", "requeue-head"))
        parser.add_argument("key", help="The subject (or concurrency key), exactly.")
        parser.add_argument("--queue", default=None,
                            help="Its queue (default: MYSQLQ['DEFAULT_QUEUE']).")
        parser.add_argument("--concurrency-key", action="store_true",
                            help="KEY is a concurrency key, not an ordered subject (show only).")

    def handle(self, *args: Any, **options: Any) -> None:
        options["queue"] = options["queue"] or get_settings().DEFAULT_QUEUE
        with cli.on_database(options["database"], [options["queue"]]):
            self._handle(**options)

    def _handle(self, **options: Any) -> None:
        queue, key, action = options["queue"], options["key"], options["action"]
        ordered = not options["concurrency_key"]
        if action != "show" and not ordered:
            raise CommandError("Only an ordered subject is held by a dead head; a concurrency "
                               "key's dead messages free their slots by themselves.")
        state = ops.subject_state(queue, key, ordered=ordered)
        if action == "show":
            kind = "subject" if ordered else "concurrency key"
            if state.counters is None:
                self.stdout.write(f"{kind} {key!r} in queue {queue!r}: nothing waits or runs.")
                return
            slots, active, blocked = state.counters
            holders = ", ".join(f"#{h.id} ({h.status})" for h in state.holders) or "none"
            self.stdout.write(f"{kind} {key!r} in queue {queue!r}: slots={slots} "
                              f"active={active} blocked={blocked}; held by {holders}")
            return
        if not state.dead_heads:
            raise CommandError(f"No dead head holds subject {key!r} in queue {queue!r} "
                               "(see: manage.py queuesubject show KEY).")
        who = ops.cli_operator()
        if action == "release":
            done, promoted = ops.release_subject(queue, key, who)
            if promoted:
                then = (f"the next message (#{promoted[0]}) runs now" if len(promoted) == 1
                        else f"the next messages ({', '.join(f'#{i}' for i in promoted)}) "
                             "run now")
            else:
                then = ("no message waits behind it: the subject's next message runs as "
                        "soon as it is enqueued")
            self.stdout.write(f"Released subject {key!r}: dead head(s) "
                              f"{', '.join(f'#{i}' for i in done)} stay dead; {then}.")
        else:
            done = ops.requeue_subject_head(queue, key, who)
            self.stdout.write(f"Requeued dead head(s) {', '.join(f'#{i}' for i in done)} of "
                              f"subject {key!r}: they run next, then the rest in order.")
