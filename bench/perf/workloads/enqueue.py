"""Enqueue through the library: single ``.enqueue()`` calls and bulk ``enqueue_many``.

Single calls are timed twice: in autocommit (the statement is its own transaction) and
each in its own ``transaction.atomic()`` (how an application enqueues beside its write;
the wake-up runs on commit). Each is compared to the raw statement sequence it issues.
"""

from __future__ import annotations

import time

from django.db import transaction

from ..benchapp.tasks import noop
from ..context import Context


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    cur = ctx.conn.cursor()
    for _ in range(ctx.repeat):
        cur.execute("TRUNCATE TABLE mysqlq_message")
        started = time.perf_counter()
        for _ in range(sizes.enqueue_single):
            noop.enqueue()
        elapsed = time.perf_counter() - started
        ctx.results.figure(
            "enqueue", "enqueue_single", "msgs/s", "msgs/s",
            raw_ref="raw/insert_single/rows/s",
            note=f"{sizes.enqueue_single:,} noop.enqueue() calls, autocommit each",
        ).add(sizes.enqueue_single / elapsed)

        cur.execute("TRUNCATE TABLE mysqlq_message")
        started = time.perf_counter()
        for _ in range(sizes.enqueue_single):
            with transaction.atomic():
                noop.enqueue()
        elapsed = time.perf_counter() - started
        ctx.results.figure(
            "enqueue", "enqueue_single_atomic", "msgs/s", "msgs/s",
            raw_ref="raw/insert_single_txn/rows/s",
            note=f"{sizes.enqueue_single:,} noop.enqueue() calls, each in its own atomic()",
        ).add(sizes.enqueue_single / elapsed)

        cur.execute("TRUNCATE TABLE mysqlq_message")
        calls = [noop.call() for _ in range(sizes.enqueue_many)]
        started = time.perf_counter()
        noop.enqueue_many(calls)
        elapsed = time.perf_counter() - started
        ctx.results.figure(
            "enqueue", "enqueue_many", "msgs/s", "msgs/s",
            raw_ref="raw/insert_multi_1000/rows/s",
            note=f"one enqueue_many() of {sizes.enqueue_many:,} (1,000-row INSERTs, "
                 "autocommit)",
        ).add(sizes.enqueue_many / elapsed)
    cur.execute("TRUNCATE TABLE mysqlq_message")
