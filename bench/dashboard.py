"""``python -m bench.dashboard``: database time of every admin page over a big queue.

    python -m bench.dashboard                       # 1,000,000 history rows over 7 days
    python -m bench.dashboard --rows 1000000 --messages 1000000 --loads 10
    python -m bench.dashboard --reuse --only history  # tables already filled: pages only
    python -m bench.dashboard --reuse --skip facet    # all but the facet counts

On its own database (``mysqlq_bench_dashboard``, or ``MYSQLQ_BENCH_DASHBOARD_DB``;
``MYSQLQ_TEST_HOST`` etc. as for the tests), created and migrated if needed, it fills the
history table with ``--rows`` rows spread evenly over ``--days`` (four queues, twenty
tasks, about 10 % failures, plus a queue and a task seen only in the oldest 2 %) and the
hot table with ``--messages`` unfinished ones (70 % ready, 20 % scheduled, 10 % dead, one
in a thousand a stuck claim), ids rising with time as in production. Then it loads every
admin page and list filter (:data:`PAGES`) ``--loads`` times each through Django's test
client as a superuser and sums, per load, the time spent in every SQL statement
(``connection.execute_wrapper``). It prints the median, p95 and worst of that database
time per page, with the slowest statement of a typical load, and writes JSON (with every
statement of a typical load) to ``bench/results/dashboard-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
DATABASE = os.environ.get("MYSQLQ_BENCH_DASHBOARD_DB", "mysqlq_bench_dashboard")
ADMIN = "/admin/django_mysqlq"
#: History rows that belong to the retired queue and task: the oldest 2 %.
OLD_SHARE = 0.02


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="history rows")
    parser.add_argument("--days", type=float, default=7.0, help="history spread over days")
    parser.add_argument("--messages", type=int, default=20_000, help="unfinished messages")
    parser.add_argument("--loads", type=int, default=20, help="page loads measured")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the tables as a previous run filled them")
    parser.add_argument("--only", default="",
                        help="measure only pages whose name contains this text")
    parser.add_argument("--skip", default=None,
                        help="leave out pages whose name contains this text")
    parser.add_argument("--retries", type=int, default=3,
                        help="when the server restarts under a page, wait for it and "
                             "measure that page again, up to N times")
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
    """History, hot rows and workers, generated in SQL from MariaDB's sequence engine."""
    from django.db import connection

    with connection.cursor() as cursor:
        print(f"filling {rows} history rows over {days} days ...", file=sys.stderr)
        cursor.execute("TRUNCATE mysqlq_attempt")
        step = days * 86400 / rows
        old = int(rows * OLD_SHARE)
        for start in range(0, rows, 100_000):
            end = min(rows, start + 100_000)
            cursor.execute(f"""
                INSERT INTO mysqlq_attempt
                  (message_id, queue, task_name, attempt, outcome, priority, enqueued_at,
                   started_at, finished_at, worker_id, host, pid, connection_id, thread,
                   error_class, error_message, traceback, result, payload)
                SELECT seq, IF(seq <= {old}, 'q-old', CONCAT('q', seq % 4)),
                       IF(seq <= {old}, 'app.tasks.retired',
                          CONCAT('app.tasks.task_', seq % 20)), 1,
                       IF(seq % 100 < 90, 'succeeded',
                          ELT(1 + seq % 3, 'retried', 'failed', 'lost')),
                       0, t - INTERVAL 1 SECOND, t - INTERVAL 50000 MICROSECOND, t,
                       'bench:1:x', 'bench', 1, 1, 'mysqlq-task-0',
                       IF(seq % 100 >= 90, 'ValueError', ''), '', '', NULL,
                       IF(seq % 100 < 90, '{{"args": [], "kwargs": {{}}}}', '')
                  FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL
                               ROUND(({rows} - seq) * {step} * 1000000) MICROSECOND AS t
                          FROM seq_{start + 1}_to_{end}) AS s
            """)
        print(f"filling {messages} unfinished messages ...", file=sys.stderr)
        cursor.execute("DELETE FROM mysqlq_message")
        for start in range(0, messages, 100_000):
            end = min(messages, start + 100_000)
            cursor.execute(f"""
                INSERT INTO mysqlq_message
                  (queue, task_name, payload, status, priority, enqueued_at, run_at, attempts,
                   max_attempts, retry_backoff, timeout, dedup_key, last_error, claim_token,
                   owner_connection, owner_server_start, worker_id, claimed_at,
                   lease_expires_at)
                SELECT CONCAT('q', seq % 4), CONCAT('app.tasks.task_', seq % 20),
                       '{{"args": [], "kwargs": {{}}}}',
                       ELT(1 + (seq % 10 >= 7) + (seq % 10 = 9) + (seq % 1000 = 999),
                           'ready', 'scheduled', 'dead', 'claimed'),
                       IF(seq % 50 = 0, 10, 0),
                       UTC_TIMESTAMP(6) - INTERVAL ({messages} - seq) SECOND,
                       UTC_TIMESTAMP(6) + INTERVAL IF(seq % 10 BETWEEN 7 AND 8, 3600, 0)
                                                   SECOND,
                       1, 3, 2, NULL, IF(seq % 100 = 1, CONCAT('order-', seq), NULL),
                       IF(seq % 10 = 9, 'ValueError: boom', ''),
                       IF(seq % 1000 = 999, MD5(seq), NULL), IF(seq % 1000 = 999, 4000000000,
                       NULL), NULL, IF(seq % 1000 = 999, 'gone:1:x', NULL),
                       IF(seq % 1000 = 999, UTC_TIMESTAMP(6), NULL),
                       IF(seq % 1000 = 999, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, NULL)
                  FROM seq_{start + 1}_to_{end}
            """)
        fill_subjects(cursor, max(1, messages // 100))
        cursor.execute("DELETE FROM mysqlq_worker")
        cursor.execute("""
            INSERT INTO mysqlq_worker (id, host, pid, queues, concurrency, connection_id,
                   started_at, last_heartbeat, stopped_at, listening, processed, failed)
            SELECT CONCAT('bench-', seq % 3, ':', seq, ':x'), CONCAT('bench-', seq % 3), seq,
                   'q0,q1,q2,q3', 4, NULL, UTC_TIMESTAMP(6) - INTERVAL 1 DAY,
                   UTC_TIMESTAMP(6) - INTERVAL IF(seq % 5 = 0, 3600, 0) SECOND,
                   IF(seq % 7 = 0, UTC_TIMESTAMP(6), NULL), 0, seq * 100, seq
              FROM seq_1_to_30""")
        for table in ("mysqlq_attempt", "mysqlq_message", "mysqlq_worker", "mysqlq_gate"):
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()


#: Blocked messages behind each ordered subject's head in the filled tables.
BLOCKED_PER_SUBJECT = 5


def fill_subjects(cursor: Any, subjects: int) -> None:
    """Ordered subjects of task_9 in q1 (``subject-N``): a head each (dead for one in four,
    ready otherwise) and ``BLOCKED_PER_SUBJECT`` blocked behind it, with their gate rows."""
    from django_mysqlq.models import GATE_ID_LENGTH

    per = 1 + BLOCKED_PER_SUBJECT
    cursor.execute("DELETE FROM mysqlq_gate")
    cursor.execute(f"""
        INSERT INTO mysqlq_message
          (queue, task_name, payload, status, priority, enqueued_at, run_at, attempts,
           max_attempts, retry_backoff, timeout, dedup_key, last_error, gate_key, gate_mode,
           gate_limit)
        SELECT 'q1', 'app.tasks.task_9', '{{"args": [], "kwargs": {{}}}}',
               IF(seq % {per} = 0, IF(seq DIV {per} % 4 = 0, 'dead', 'ready'), 'blocked'), 0,
               UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 1, 3, 2, NULL, NULL,
               IF(seq % {per} = 0 AND seq DIV {per} % 4 = 0, 'ValueError: boom', ''),
               CONCAT('subject-', seq DIV {per}), 'hold', 1
          FROM seq_0_to_{subjects * per - 1}
    """)
    cursor.execute(f"""
        INSERT INTO mysqlq_gate (id, queue, ordered, gate_key, slots, active, blocked,
                                 changed_at)
        SELECT SUBSTR(SHA2(CONCAT('q1', CHAR(0), '1', CHAR(0), 'subject-', seq), 256), 1,
                      {GATE_ID_LENGTH}),
               'q1', 1, CONCAT('subject-', seq), 1, 1, {BLOCKED_PER_SUBJECT}, UTC_TIMESTAMP(6)
          FROM seq_0_to_{subjects - 1}
    """)


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
            self.statements.append((elapsed, " ".join(sql.split())[:160]))


def pages() -> dict[str, str]:
    """Every admin page and list filter, with ids and dates taken from the filled tables."""
    from django.db import connection
    from django.utils import timezone

    def first(sql: str) -> int:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            row = cursor.fetchone()
        return int(row[0]) if row else 0

    dead = first("SELECT id FROM mysqlq_message WHERE status = 'dead' ORDER BY id LIMIT 1")
    blocked = first("SELECT id FROM mysqlq_message WHERE status = 'blocked' ORDER BY id LIMIT 1")
    stuck = first("SELECT id FROM mysqlq_message WHERE status = 'claimed' ORDER BY id LIMIT 1")
    ready = first("SELECT MAX(id) FROM mysqlq_message")
    attempt = first("SELECT MAX(id) FROM mysqlq_attempt")
    traced = first(f"SELECT message_id FROM mysqlq_attempt WHERE id = {attempt}")
    today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    tomorrow = today + dt.timedelta(days=1)
    week = today - dt.timedelta(days=7)

    def day(value: dt.datetime) -> str:
        return str(value).replace(" ", "+").replace("+00:00", "%2B00:00")

    messages, history = f"{ADMIN}/message/", f"{ADMIN}/attempt/"
    return {
        "admin index (queue box)": "/admin/",
        "dashboard": f"{ADMIN}/queuestate/?refresh=0",
        "messages": messages,
        "messages, page 50": messages + "?p=50",
        "messages, facet counts": messages + "?_facets=True",
        "messages, status ready": messages + "?status__exact=ready",
        "messages, status scheduled": messages + "?status__exact=scheduled",
        "messages, status dead": messages + "?status__exact=dead",
        "messages, status claimed": messages + "?status__exact=claimed",
        "messages, status blocked": messages + "?status__exact=blocked",
        "messages, queue q1": messages + "?queue=q1",
        "messages, queue q1 ready": messages + "?queue=q1&status__exact=ready",
        "messages, queue (none)": messages + "?queue=nosuch",
        "messages, task task_7": messages + "?task=app.tasks.task_7",
        "messages, task (none)": messages + "?task=app.tasks.nosuch",
        "messages, stuck": messages + "?stuck=yes",
        "messages, search id": messages + f"?q={ready}",
        "messages, search task name": messages + "?q=app.tasks.task_7",
        "messages, search dedup key": messages + "?q=order-101",
        "messages, search subject": messages + "?q=subject-3",
        "messages, search (no match)": messages + "?q=nothing-like-this",
        "message page (dead)": f"{messages}{dead}/change/",
        "message page (stuck)": f"{messages}{stuck}/change/",
        "message page (blocked)": f"{messages}{blocked}/change/",
        "message, cancel confirmation": f"{messages}{dead}/act/cancel/",
        "requeue dead matching, queue q1": f"{messages}requeue-dead-matching/?queue=q1",
        "stuck list": f"{ADMIN}/stuckmessage/",
        "stuck list, queue q3": f"{ADMIN}/stuckmessage/?queue=q3",
        "stuck list, task task_19": f"{ADMIN}/stuckmessage/?task=app.tasks.task_19",
        "blocked list": f"{ADMIN}/blockedmessage/",
        "blocked list, queue q1": f"{ADMIN}/blockedmessage/?queue=q1",
        "blocked list, task task_9": f"{ADMIN}/blockedmessage/?task=app.tasks.task_9",
        "dead list": f"{ADMIN}/deadmessage/",
        "dead list, queue q1": f"{ADMIN}/deadmessage/?queue=q1",
        "dead list, queue q0 (none)": f"{ADMIN}/deadmessage/?queue=q0",
        "dead list, task task_9": f"{ADMIN}/deadmessage/?task=app.tasks.task_9",
        "history": history,
        "history, page 50": history + "?p=50",
        "history, facet counts": history + "?_facets=True",
        "history, outcome failed": history + "?outcome__exact=failed",
        "history, outcome cancelled (none)": history + "?outcome__exact=cancelled",
        "history, task task_7": history + "?task=app.tasks.task_7",
        "history, task retired (old)": history + "?task=app.tasks.retired",
        "history, queue q1": history + "?queue=q1",
        "history, queue q-old (old)": history + "?queue=q-old",
        "history, finished today": history + (f"?finished_at__gte={day(today)}"
                                              f"&finished_at__lt={day(tomorrow)}"),
        "history, finished past 7 days": history + (f"?finished_at__gte={day(week)}"
                                                    f"&finished_at__lt={day(tomorrow)}"),
        "history, one message's trace": history + f"?message_id={traced}",
        "history, search message id": history + f"?q={traced}",
        "history, search task name": history + "?q=app.tasks.task_7",
        "history, search (no match)": history + "?q=nothing-like-this",
        "history row page": f"{history}{attempt}/change/",
        "workers": f"{ADMIN}/worker/",
        "workers, alive": f"{ADMIN}/worker/?state=alive",
        "workers, stale": f"{ADMIN}/worker/?state=stale",
        "workers, host": f"{ADMIN}/worker/?host=bench-1",
    }


def wait_for_server(seconds: float = 180.0) -> None:
    """Wait until the server accepts connections again, with fresh Django connections."""
    import MySQLdb
    from django.db import connections

    connections.close_all()
    deadline = time.monotonic() + seconds
    while True:
        try:
            MySQLdb.connect(host=os.environ.get("MYSQLQ_TEST_HOST", "127.0.0.1"),
                            port=int(os.environ.get("MYSQLQ_TEST_PORT", "3306")),
                            user=os.environ.get("MYSQLQ_TEST_USER", "root"),
                            password=os.environ.get("MYSQLQ_TEST_PASSWORD", "")).close()
            return
        except MySQLdb.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def measure_robustly(url: str, loads: int, retries: int) -> dict[str, Any]:
    """:func:`measure`, again after a server restart (a shared server, a chaos test)."""
    from django.db import OperationalError

    for attempt in range(retries + 1):
        try:
            return measure(url, loads)
        except OperationalError as exc:
            if attempt == retries or exc.args[0] not in (2002, 2006, 2013):
                raise
            print(f"  (server gone during {url}: {exc}; waiting, then measuring again)",
                  file=sys.stderr)
            wait_for_server()
    raise AssertionError("unreachable")


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
        assert response.status_code == 200, (url, response.status_code)
        totals.append(timer.seconds * 1000)
        timers.append(timer)
    median = statistics.median(totals)
    typical = min(timers, key=lambda t: abs(t.seconds * 1000 - median))
    return {
        "url": url,
        "loads": loads,
        "db_ms_median": round(median, 1),
        "db_ms_p95": round(sorted(totals)[math.ceil(len(totals) * 0.95) - 1], 1),
        "db_ms_max": round(max(totals), 1),
        "statements": [{"ms": round(s * 1000, 2), "sql": sql} for s, sql in typical.statements],
    }


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's host, 'testserver', is then allowed
    if not options.reuse:
        fill(options.rows, options.days, options.messages)
    result: dict[str, Any] = {"database": DATABASE, "rows": options.rows,
                              "days": options.days, "messages": options.messages,
                              "pages": {}}
    print(f"{options.rows:,} history rows over {options.days:g} days, "
          f"{options.messages:,} unfinished messages, {options.loads} loads per page; "
          "database time per page load, ms:")
    print(f"  {'page':<38} {'median':>8} {'p95':>8} {'worst':>8}  slowest statement")
    for name, url in pages().items():
        if options.only not in name or (options.skip and options.skip in name):
            continue
        page = measure_robustly(url, options.loads, options.retries)
        result["pages"][name] = page
        slowest = max(page["statements"], key=lambda s: s["ms"], default={"ms": 0, "sql": ""})
        print(f"  {name:<38} {page['db_ms_median']:>8} {page['db_ms_p95']:>8} "
              f"{page['db_ms_max']:>8}  {slowest['ms']:.1f} ms {slowest['sql'][:70]}",
              flush=True)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"dashboard-{time.strftime('%Y%m%d-%H%M%S')}.json"
    while path.exists():  # two runs within a second
        path = path.with_name(path.stem + "-next.json")
    path.write_text(json.dumps(result, indent=2))
    print(f"  written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
