"""Enqueue through the library: single ``.enqueue()`` calls and bulk ``enqueue_many``.

Single calls are timed in autocommit (the statement is its own transaction), each in its
own ``transaction.atomic()`` (how an application enqueues beside its write; the wake-up
runs on commit), and so again with a dedup key each (the key's named lock). Each is
compared to the raw statement sequence it issues.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from django.db import transaction

from ..benchapp.tasks import noop
from ..context import Context


def run(ctx: Context) -> None:
    sizes = ctx.sizes
    single, many = sizes.enqueue_single, sizes.enqueue_many

    def one_by_one() -> None:
        for _ in range(single):
            noop.enqueue()

    def each_in_atomic() -> None:
        for _ in range(single):
            with transaction.atomic():
                noop.enqueue()

    def each_with_a_dedup_key(repeat: int) -> None:
        # (A key per message: the common case, no duplicate; the key's lock is taken.)
        for seq in range(single):
            with transaction.atomic():
                noop.using(dedup_key=f"bench:{repeat}:{seq}").enqueue()

    for repeat in range(ctx.repeat):
        _measure(ctx, "enqueue_single", "raw/insert_single/rows/s", single, one_by_one,
                 f"{single:,} noop.enqueue() calls, autocommit each")
        _measure(ctx, "enqueue_single_atomic", "raw/insert_single_txn/rows/s", single,
                 each_in_atomic, f"{single:,} noop.enqueue() calls, each in its own atomic()")
        _measure(ctx, "enqueue_single_dedup_atomic", "raw/insert_single_txn/rows/s", single,
                 functools.partial(each_with_a_dedup_key, repeat),
                 f"{single:,} noop.using(dedup_key=…).enqueue() calls, each in its own "
                 "atomic() (a new key each: the key's named lock, no duplicate)")
        calls = [noop.call() for _ in range(many)]
        _measure(ctx, "enqueue_many", "raw/insert_multi_1000/rows/s", many,
                 functools.partial(noop.enqueue_many, calls),
                 f"one enqueue_many() of {many:,} (1,000-row INSERTs, autocommit)")
    ctx.conn.cursor().execute("TRUNCATE TABLE mysqlq_message")


def _measure(ctx: Context, case: str, raw_ref: str, count: int, body: Callable[[], object],
             note: str) -> None:
    """Time ``body`` on an empty queue table and record ``count`` messages per second."""
    ctx.conn.cursor().execute("TRUNCATE TABLE mysqlq_message")
    started = time.perf_counter()
    body()
    elapsed = time.perf_counter() - started
    ctx.results.figure("enqueue", case, "msgs/s", "msgs/s", raw_ref=raw_ref,
                       note=note).add(count / elapsed)
