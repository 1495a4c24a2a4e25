"""``python -m bench.dashboard``: database time of one dashboard page load over a big history.

    python -m bench.dashboard                       # 1,000,000 history rows over 7 days
    python -m bench.dashboard --rows 200000 --loads 10

On its own database ``mysqlq_bench_dashboard`` (``MYSQLQ_TEST_HOST`` etc. as for the
tests), created and migrated if needed, it fills the history table with ``--rows`` rows
spread evenly over ``--days`` (four queues, twenty tasks, about 10 % failures) and the hot
table with ``--messages`` unfinished ones (ready, scheduled, dead and a few stuck claims),
ending now (about 20 s for a million rows on a 2-core machine). Then it loads the
dashboard, the history list and the history list filtered to failures ``--loads`` times
each through Django's test client as a superuser and sums, per load, the time spent in
every SQL statement (``connection.execute_wrapper``). It prints the median, p95 and worst
of that database time, with the dashboard's statements, and writes JSON to
``bench/results/dashboard-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DATABASE = "mysqlq_bench_dashboard"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="history rows")
    parser.add_argument("--days", type=float, default=7.0, help="history spread over days")
    parser.add_argument("--messages", type=int, default=20_000, help="unfinished messages")
    parser.add_argument("--loads", type=int, default=20, help="page loads measured")
    return parser.parse_args(argv)


def setup() -> None:
    import MySQLdb

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    os.environ["MYSQLQ_TEST_DB"] = DATABASE
    server = MySQLdb.connect(host=os.environ.get("MYSQLQ_TEST_HOST", "127.0.0.1"),
                             port=int(os.environ.get("MYSQLQ_TEST_PORT", "3306")),
                             user=os.environ.get("MYSQLQ_TEST_USER", "root"),
                             password=os.environ.get("MYSQLQ_TEST_PASSWORD", ""))
    server.cursor().execute(f"CREATE DATABASE IF NOT EXISTS {DATABASE} CHARACTER SET utf8mb4")
    server.close()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(rows: int, days: float, messages: int) -> None:
    """History and hot rows, generated in SQL from MariaDB's sequence engine."""
    from django.db import connection

    with connection.cursor() as cursor:
        print(f"filling {rows} history rows over {days} days ...", file=sys.stderr)
        cursor.execute("TRUNCATE mysqlq_attempt")
        step = days * 86400 / rows
        for start in range(0, rows, 100_000):
            end = min(rows, start + 100_000)
            cursor.execute(f"""
                INSERT INTO mysqlq_attempt
                  (message_id, queue, task_name, attempt, outcome, priority, enqueued_at,
                   started_at, finished_at, worker_id, host, pid, connection_id, thread,
                   error_class, error_message, traceback, result, payload)
                SELECT seq, CONCAT('q', seq % 4), CONCAT('app.tasks.task_', seq % 20), 1,
                       IF(seq % 100 < 90, 'succeeded',
                          ELT(1 + seq % 3, 'retried', 'failed', 'lost')),
                       0, t - INTERVAL 1 SECOND, t - INTERVAL 50000 MICROSECOND, t,
                       'bench:1:x', 'bench', 1, 1, 'mysqlq-task-0',
                       IF(seq % 100 >= 90, 'ValueError', ''), '', '', NULL, ''
                  FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL
                               ROUND((seq - 1) * {step} * 1000000) MICROSECOND AS t
                          FROM seq_{start + 1}_to_{end}) AS s
            """.replace("INTERVAL 50 MILLISECOND(0)", "INTERVAL 50000 MICROSECOND"))
        print(f"filling {messages} unfinished messages ...", file=sys.stderr)
        cursor.execute("DELETE FROM mysqlq_message")
        cursor.execute(f"""
            INSERT INTO mysqlq_message
              (queue, task_name, payload, status, priority, enqueued_at, run_at, attempts,
               max_attempts, retry_backoff, timeout, last_error, claim_token,
               owner_connection, owner_server_start, worker_id, claimed_at,
               lease_expires_at)
            SELECT CONCAT('q', seq % 4), CONCAT('app.tasks.task_', seq % 20),
                   '{{"args": [], "kwargs": {{}}}}',
                   ELT(1 + (seq % 10 >= 7) + (seq % 10 = 9) + (seq % 1000 = 999),
                       'ready', 'scheduled', 'dead', 'claimed'),
                   0, UTC_TIMESTAMP(6) - INTERVAL seq SECOND,
                   UTC_TIMESTAMP(6) + INTERVAL IF(seq % 10 BETWEEN 7 AND 8, 3600, 0) SECOND,
                   1, 3, 2, NULL, '',
                   IF(seq % 1000 = 999, MD5(seq), NULL), IF(seq % 1000 = 999, 4000000000,
                   NULL), NULL, IF(seq % 1000 = 999, 'gone:1:x', NULL),
                   IF(seq % 1000 = 999, UTC_TIMESTAMP(6), NULL),
                   IF(seq % 1000 = 999, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, NULL)
              FROM seq_1_to_{messages}
        """)
        for table in ("mysqlq_attempt", "mysqlq_message"):
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()


class Timer:
    """An execute wrapper summing the time of every statement, and keeping them."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.statements: list[tuple[float, str]] = []

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - start
            self.seconds += elapsed
            self.statements.append((elapsed, " ".join(sql.split())[:110]))


PAGES = {
    "dashboard": "/admin/django_mysqlq/queuestate/?refresh=0",
    "history list": "/admin/django_mysqlq/attempt/",
    "history list, failed only": "/admin/django_mysqlq/attempt/?outcome__exact=failed",
}


def measure(url: str, loads: int) -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    account, _ = User.objects.get_or_create(username="bench", defaults={
        "is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(account)
    client.get(url)  # warm caches and the connection
    totals, timers = [], []
    for _ in range(loads):
        timer = Timer()
        with connection.execute_wrapper(timer):
            response = client.get(url)
        assert response.status_code == 200, response.status_code
        totals.append(timer.seconds * 1000)
        timers.append(timer)
    median = statistics.median(totals)
    typical = min(timers, key=lambda t: abs(t.seconds * 1000 - median))
    return {
        "loads": loads,
        "db_ms_median": round(median, 1),
        "db_ms_p95": round(sorted(totals)[max(0, int(len(totals) * 0.95) - 1)], 1),
        "db_ms_max": round(max(totals), 1),
        "statements": [{"ms": round(s * 1000, 2), "sql": sql} for s, sql in typical.statements],
    }


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's host, 'testserver', is then allowed
    fill(options.rows, options.days, options.messages)
    result: dict[str, Any] = {"rows": options.rows, "days": options.days,
                              "messages": options.messages, "pages": {}}
    print(f"{options.rows:,} history rows over {options.days:g} days, "
          f"{options.messages:,} unfinished messages, {options.loads} loads per page:")
    for name, url in PAGES.items():
        page = measure(url, options.loads)
        result["pages"][name] = page
        print(f"  {name}: database time per load: median {page['db_ms_median']} ms, "
              f"p95 {page['db_ms_p95']} ms, worst {page['db_ms_max']} ms")
        if name == "dashboard":
            for statement in page["statements"]:
                print(f"    {statement['ms']:8.2f} ms  {statement['sql']}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"dashboard-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"  written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
