"""Seeded history for the pipeline tests, and the same questions asked in SQL."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.db import connection

from django_mysqlq.models import Attempt, Message

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
QUEUES = ("default", "emails")
TASKS = ("tests.testapp.tasks.record", "tests.testapp.tasks.always_fails", "shop.render")
OUTCOMES = ("succeeded", "succeeded", "succeeded", "retried", "failed", "lost", "cancelled",
            "requeued")
ERRORS = ("ValueError", "TimeoutError", "")


def seed_history(count: int, *, start: dt.datetime, span: dt.timedelta,
                 message_base: int = 1_000) -> list[Attempt]:
    """``count`` history rows finished evenly over ``[start, start + span)``: every outcome,
    two queues, three tasks, waits and runs that differ, payloads on final rows."""
    rows = []
    step = span / count
    for index in range(count):
        finished = start + step * index
        outcome = OUTCOMES[index % len(OUTCOMES)]
        run = dt.timedelta(milliseconds=5 + (index * 37) % 900)
        wait = dt.timedelta(milliseconds=1 + (index * 53) % 4000)
        started = None if outcome in ("cancelled", "requeued") else finished - run
        error = ERRORS[index % 3] if outcome in ("retried", "failed", "lost") else ""
        final = outcome in ("succeeded", "failed", "cancelled")
        rows.append(Attempt(
            message_id=message_base + index // 2, queue=QUEUES[index % 2],
            task_name=TASKS[(index // 2) % 3], attempt=1 + index % 2, outcome=outcome,
            priority=index % 5, enqueued_at=(started or finished) - wait,
            started_at=started, finished_at=finished, worker_id="w", error_class=error,
            error_message=f"boom {index}" if error else "",
            payload=json.dumps({"args": [f"label-{index}"], "kwargs": {}}) if final else "",
            actor="cli:root" if outcome in ("cancelled", "requeued") else ""))
    return Attempt.objects.bulk_create(rows, batch_size=1000)


def sql(query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(query, params or [])
        return list(cursor.fetchall())


def naive(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def sql_counts(since: dt.datetime, until: dt.datetime) -> dict[tuple[str, str], dict[str, int]]:
    """Per (queue, task): the report's counts, asked in SQL."""
    rows = sql("""
        SELECT queue, task_name,
               SUM(outcome IN ('succeeded', 'retried', 'failed', 'lost')),
               COUNT(DISTINCT IF(outcome IN ('succeeded', 'retried', 'failed', 'lost'),
                                 message_id, NULL)),
               SUM(outcome = 'succeeded'), SUM(outcome = 'retried'), SUM(outcome = 'failed'),
               SUM(outcome = 'lost'), SUM(outcome = 'cancelled')
          FROM mysqlq_attempt WHERE finished_at >= %s AND finished_at < %s
         GROUP BY queue, task_name""", [naive(since), naive(until)])
    names = ("attempts", "messages", "succeeded", "retried", "failed", "lost", "cancelled")
    return {(queue, task): dict(zip(names, map(int, values), strict=True))
            for queue, task, *values in rows}


def durations_ms(since: dt.datetime, until: dt.datetime, queue: str, task: str,
                 kind: str) -> list[float]:
    later, earlier = ("started_at", "enqueued_at") if kind == "wait" else ("finished_at",
                                                                           "started_at")
    rows = sql(f"""
        SELECT TIMESTAMPDIFF(MICROSECOND, {earlier}, {later}) / 1000 FROM mysqlq_attempt
         WHERE finished_at >= %s AND finished_at < %s AND queue = %s AND task_name = %s
           AND outcome IN ('succeeded', 'retried', 'failed', 'lost')
           AND started_at IS NOT NULL""", [naive(since), naive(until), queue, task])
    return sorted(float(row[0]) for row in rows)


def message_count() -> int:
    return Message.objects.count()
