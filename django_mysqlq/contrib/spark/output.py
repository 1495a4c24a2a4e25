"""A report's files: ``summary.json``, one Parquet dataset per table, ``report.html``, and
the few lines printed on stdout."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from .layout import join
from .page import render_page
from .store import Store

#: Fields of a ``by_task`` entry in ``summary.json``, in order.
TASK_FIELDS = ("queue", "task_name", "attempts", "messages", "succeeded", "retried",
               "failed", "lost", "cancelled", "success_rate", "failure_rate",
               "attempts_per_message", "throughput_per_hour", "wait_ms_p50", "wait_ms_p95",
               "wait_ms_p99", "run_ms_p50", "run_ms_p95", "run_ms_p99")
TOTAL_FIELDS = TASK_FIELDS[2:]


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        # PySpark hands a timestamp back as a naive datetime in the process's local time
        # (Django sets TZ to TIME_ZONE): as UTC with its offset, like the window's bounds.
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _records(frame: DataFrame) -> list[dict[str, Any]]:
    return [{key: _plain(value) for key, value in row.asDict().items()}
            for row in frame.collect()]


def _pick(record: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {field: record.get(field) for field in fields}


def summarize(tables: dict[str, list[dict[str, Any]]], meta: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s content from the collected tables."""
    totals = tables["totals"][0] if tables["totals"] else {}
    empty = dict.fromkeys(("attempts", "messages", *("succeeded", "retried", "failed",
                                                     "lost", "cancelled")), 0)
    by_task = [_pick(record, TASK_FIELDS) for record in tables["by_task"]]
    return {
        **meta,
        "totals": {**dict.fromkeys(TOTAL_FIELDS), **empty,
                   **{key: value for key, value in _pick(totals, TOTAL_FIELDS).items()
                      if value is not None}},
        "by_queue": [_pick(record, ("queue", *TOTAL_FIELDS)) for record in tables["by_queue"]],
        "by_task": by_task,
        "top_errors": tables["errors"][:20],
        "slowest_tasks": sorted((task for task in by_task if task["run_ms_p99"] is not None),
                                key=lambda task: -task["run_ms_p99"])[:10],
        "slowest_attempts": tables["slowest_attempts"],
        "datasets": sorted(tables),
    }


def text_summary(summary: dict[str, Any]) -> str:
    """A few lines for stdout: the window, the totals, the worst tasks and errors."""
    totals = summary["totals"]
    window = summary["window"]
    rate = totals.get("success_rate")
    lines = [
        f"Window {window['since']} .. {window['until']}: {totals['attempts']} attempts of "
        f"{totals['messages']} messages; succeeded {totals['succeeded']}, retried "
        f"{totals['retried']}, failed {totals['failed']}, lost {totals['lost']}, cancelled "
        f"{totals['cancelled']}" + (f"; success rate {rate:.2%}" if rate is not None else ""),
    ]
    for task in summary["slowest_tasks"][:3]:
        lines.append(f"  slow: {task['queue']}/{task['task_name']} run p99 "
                     f"{task['run_ms_p99']:.0f} ms, wait p99 {task['wait_ms_p99']:.0f} ms")
    for error in summary["top_errors"][:3]:
        lines.append(f"  error: {error['error_class']} x{error['count']} in "
                     f"{error['task_name']} (e.g. message #{error['example_message_id']})")
    return "\n".join(lines)


def write_outputs(spark: SparkSession, frames: dict[str, DataFrame], meta: dict[str, Any],
                  output: str) -> tuple[dict[str, Any], str]:
    """Collect the tables, write every file under ``output``; return the summary and text."""
    store = Store(spark, output)
    store.mkdirs(output)
    tables: dict[str, list[dict[str, Any]]] = {}
    for name, frame in frames.items():
        frame = frame.cache()
        tables[name] = _records(frame)
        frame.coalesce(1).write.mode("overwrite").parquet(join(output, name))
        frame.unpersist()
    summary = summarize(tables, meta)
    store.write_text(join(output, "summary.json"),
                     json.dumps(summary, indent=2, default=str) + "\n")
    store.write_text(join(output, "report.html"), render_page(summary, tables))
    return summary, text_summary(summary)
