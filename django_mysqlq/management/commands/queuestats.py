"""``manage.py queuestats``: the dashboard in a terminal (a table, or JSON)."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django_mysqlq import limits, ops, views
from django_mysqlq.conf import get_settings
from django_mysqlq.management import cli

from .queueschedule import table as schedule_table
from .queuetopic import groups_table

#: The shortest --watch interval: each redraw runs the dashboard's queries again.
SHORTEST_WATCH = 0.5


def _watch_seconds(text: str) -> float:
    """``--watch``'s interval: a finite number of seconds from :data:`SHORTEST_WATCH` to 100
    years (``inf`` made ``time.sleep`` raise OverflowError, ``nan``, ``0`` and negative ones
    redrew all the time or printed once)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not SHORTEST_WATCH <= seconds <= limits.MAX_SECONDS:
        raise ArgumentTypeError(f"expected a number of seconds from {SHORTEST_WATCH} to "
                                f"{limits.MAX_SECONDS_TEXT}, e.g. --watch 5, not {text!r}")
    return seconds


COLUMNS = ("queue", "ready", "scheduled", "claimed", "blocked", "throttled", "dead", "oldest",
           "1m", "5m", "60m", "fail%")


TOPIC_COLUMNS = ("topic", "last-offset", "kept", "1m", "5m", "60m", "msg/s", "last-publish")


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """The rows as columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                      for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]


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
    lines = _aligned(rows)
    lines.append(f"workers alive: {data.workers_alive}   stuck: {data.stuck}")
    lines.extend(f"WARNING: worker {worker.worker_id}: {line}"
                 for worker in data.worker_troubles for line in worker.lines)
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
    lines.extend(_topic_lines(data))
    return "\n".join(lines)


def _when(moment: dt.datetime | None) -> str:
    return cli.utc(moment) if moment is not None else "-"


def _topic_lines(data: ops.Dashboard) -> list[str]:
    lines: list[str] = []
    if data.topics:
        rows: list[tuple[str, ...]] = [TOPIC_COLUMNS]
        rows.extend((t.name, str(t.last_offset), str(t.kept), str(t.published.get(1, 0)),
                     str(t.published.get(5, 0)), str(t.published.get(60, 0)),
                     f"{t.rate_per_second:.2f}", _when(t.last_publish)) for t in data.topics)
        table = _aligned(rows)
        lines.extend(["", f"{table[0]}  (busiest first)", *table[1:]])
    if data.groups:
        lines.extend(["", groups_table(data.groups)])
    for o in data.overran:
        of = (f"of group {o.group!r} on topic {o.topic!r} " if o.group
              else f"{o.task_name} ")
        on = f" on offset {o.offset}" if o.offset is not None else ""
        lines.append(f"WARNING: topic handler {of}has run {o.running_seconds:.0f}s{on} "
                     f"(delivery #{o.message_id}), past its timeout of {o.timeout:.0f}s "
                     f"({o.worker_id or '-'}).")
    return lines


class Command(cli.SaysDatabaseErrors):
    help = ("Per-queue counts (blocked: waiting behind their ordered subject's head or for a "
            "slot of their concurrency key), oldest ready age, throughput and failure rate; "
            "workers alive; the server's purge lag; recurring tasks with their last and next "
            "run; topics (publish volume, busiest first) and consumer groups (position, lag, "
            "oldest unhandled, dead), topic handlers past their timeout.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead.")
        parser.add_argument("--database", default=None, metavar="ALIAS",
                            help="Only this queue database (default: every alias that "
                                 "holds queues, each read from its MYSQLQ['READ_DATABASE'] "
                                 "replica if it has one).")
        parser.add_argument("--watch", type=_watch_seconds, nargs="?", const=2.0, default=None,
                            metavar="SECONDS",
                            help=f"Print again every SECONDS (default 2; at least "
                                 f"{SHORTEST_WATCH}) until Ctrl-C.")

    def handle(self, *args: Any, **options: Any) -> None:
        only = cli.queue_database(options["database"])
        while True:
            found = views.dashboards(only=only)
            several = len(found) > 1 or found[0].lag is not None or found[0].alias != \
                get_settings().DATABASE
            if options["json"]:
                self.stdout.write(json.dumps(
                    {"databases": [view.as_json() for view in found]} if len(found) > 1
                    else found[0].as_json()))
            else:
                if options["watch"] is not None:
                    self.stdout.write("\x1b[2J\x1b[H", ending="")
                self.stdout.write("\n\n".join(
                    (f"== {view.title}\n" if several else "") + _table(view.dashboard)
                    for view in found))
            if options["watch"] is None:
                return
            try:
                time.sleep(options["watch"])
            except KeyboardInterrupt:
                return
