"""``manage.py queuestats``: the dashboard in a terminal (a table, or JSON)."""

from __future__ import annotations

import json
import time
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from django_mysqlq import ops

from .queueschedule import table as schedule_table

COLUMNS = ("queue", "ready", "scheduled", "claimed", "blocked", "throttled", "dead", "oldest",
           "1m", "5m", "60m", "fail%")


def _table(data: ops.Dashboard) -> str:
    rows: list[tuple[str, ...]] = [COLUMNS]
    for q in data.queues:
        oldest = "-" if q.oldest_ready_seconds is None else f"{q.oldest_ready_seconds:.0f}s"
        rate = "-" if q.failure_rate is None else f"{100 * q.failure_rate:.0f}"
        marks = (" (paused)" if q.paused else "") + (" (no worker)" if q.unserved else "")
        rows.append((q.name + marks, str(q.ready),
                     str(q.scheduled), str(q.claimed), str(q.blocked), str(q.throttled),
                     str(q.dead), oldest,
                     *(str(q.throughput.get(m, 0)) for m in ops.WINDOWS), rate))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.append(f"workers alive: {data.workers_alive}   stuck: {data.stuck}")
    if data.unserved:
        lines.append(f"WARNING: {data.unserved_text}")
    lines.append(f"purge lag: {data.purge_lag.describe()}")
    if data.purge_warning:
        lines.append(f"WARNING: {data.purge_warning}")
    if data.top_failing:
        lines.append("top failing (60 min): " + ", ".join(f"{t} ({n})"
                                                            for t, n in data.top_failing[:5]))
    if data.schedules:
        lines.extend(["", schedule_table(data.schedules)])
    return "\n".join(lines)


class Command(BaseCommand):
    help = ("Per-queue counts (blocked: waiting behind their ordered subject's head or for a "
            "slot of their concurrency key), oldest ready age, throughput and failure rate; "
            "workers alive; the server's purge lag; recurring tasks with their last and next "
            "run.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead.")
        parser.add_argument("--watch", type=float, nargs="?", const=2.0, default=None,
                            metavar="SECONDS",
                            help="Print again every SECONDS (default 2) until Ctrl-C.")

    def handle(self, *args: Any, **options: Any) -> None:
        while True:
            data = ops.dashboard()
            if options["json"]:
                self.stdout.write(json.dumps(data.as_json()))
            else:
                if options["watch"]:
                    self.stdout.write("\x1b[2J\x1b[H", ending="")
                self.stdout.write(_table(data))
            if not options["watch"]:
                return
            try:
                time.sleep(max(0.2, options["watch"]))
            except KeyboardInterrupt:
                return
