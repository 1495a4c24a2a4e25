"""``manage.py queueschedule``: list recurring tasks; pause, resume or prune them."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from django_mysqlq import ops, scheduling
from django_mysqlq.management import cli

COLUMNS = ("schedule", "task", "cron", "zone", "catch-up", "state", "last run", "next run")


def table(rows: list[scheduling.ScheduleStatus]) -> str:
    """The schedules as aligned text (``queuestats`` prints it too)."""
    if not rows:
        return "no schedules (declare one with @queue_task(cron=...) or MYSQLQ['SCHEDULES'])"
    lines: list[tuple[str, ...]] = [COLUMNS, *(
        (s.name, s.task_name, s.cron, s.timezone, s.catch_up, s.state_text, s.last_local,
         s.next_local) for s in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
            .rstrip() for line in lines]
    text.extend(f"{s.name}: {s.error}" for s in rows if s.error)
    return "\n".join(text)


class Command(cli.SaysDatabaseErrors):
    help = ("List recurring tasks with their last and next run; pause or resume them (a "
            "resumed one starts from its next occurrence: the paused ones are not caught "
            "up); prune those no worker declares any more; run one now.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        cli.add_database_argument(parser)
        parser.add_argument("action", nargs="?", default="list",
                            choices=("list", "pause", "resume", "prune", "run"),
                            help="list (default), pause, resume, prune, or run (enqueue "
                                 "one run of each now, its schedule unchanged).")
        parser.add_argument("names", nargs="*", help="Schedule names (pause, resume and "
                                                     "run need at least one).")
        parser.add_argument("--json", action="store_true",
                            help="Print JSON instead: list, the schedules; pause and resume, "
                                 "{action, changed, unchanged}; prune, {action, deleted}; "
                                 "run, {action, enqueued: {name: message id}}.")

    def handle(self, *args: Any, **options: Any) -> None:
        with cli.on_database(options["database"]):
            self._handle(**options)

    def _handle(self, **options: Any) -> None:
        action, names = options["action"], options["names"]
        _, problems = scheduling.write_declared()  # the good ones, even if one is wrong
        for problem in problems:
            self.stderr.write(f"Declared schedule not written: {problem}")
        if action == "list":
            if names:
                raise CommandError("list takes no names; it lists every schedule.")
            rows = scheduling.statuses()
            self.stdout.write(json.dumps([row.as_json() for row in rows]) if options["json"]
                              else table(rows))
            return
        known = scheduling.known_names()
        unknown = sorted(set(names) - known)
        if unknown:
            raise CommandError(f"No schedule named {', '.join(map(repr, unknown))}; known: "
                               f"{', '.join(sorted(known)) or 'none'}.")
        if action == "prune":
            deleted = scheduling.prune(names or None)
            self._say(options, {"action": action, "deleted": deleted},
                      f"Deleted {deleted} removed schedule(s).")
            return
        if not names:
            raise CommandError(f"{action} needs the names of the schedules to {action}.")
        if action == "run":
            made = scheduling.run_now(names, ops.cli_operator())
            self._say(options, {"action": action, "enqueued": made}, "Enqueued: " + ", ".join(
                f"{name} (#{message_id})" for name, message_id in made.items()) + ".")
            return
        changed = scheduling.set_paused(names, action == "pause", ops.cli_operator())
        verb = "Paused" if action == "pause" else "Resumed"
        self._say(options, {"action": action, "changed": changed,
                            "unchanged": sorted(set(names) - set(changed))},
                  f"{verb}: {', '.join(changed) or 'none (already so)'}.")

    def _say(self, options: dict[str, Any], data: dict[str, Any], text: str) -> None:
        """What an action did: JSON with --json (for scripts), else one sentence."""
        self.stdout.write(json.dumps(data) if options["json"] else text)
