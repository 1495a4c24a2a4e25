"""``queuepipeline report``: counts equal SQL's, percentiles within the stated error."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from .support import NOW, QUEUES, TASKS, durations_ms, seed_history, sql_counts

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

SINCE = NOW - dt.timedelta(hours=6)
UNTIL = NOW


@pytest.fixture
def seeded() -> None:
    # 400 rows in the window, 40 before it and 40 after it (never counted).
    seed_history(40, start=SINCE - dt.timedelta(hours=2), span=dt.timedelta(hours=1),
                 message_base=100_000)
    seed_history(400, start=SINCE, span=UNTIL - SINCE)
    seed_history(40, start=UNTIL, span=dt.timedelta(minutes=30), message_base=200_000)


def _within_rank_error(value: float, exact: list[float], percentile: float) -> bool:
    """Whether ``value`` is a value whose rank is within n/accuracy of p·n (and one row)."""
    from django_mysqlq.contrib.spark.analytics import ACCURACY

    n = len(exact)
    slack = math.ceil(n / ACCURACY) + 1
    target = math.ceil(percentile * n) - 1
    allowed = exact[max(0, target - slack):min(n, target + slack + 1)]
    return any(abs(value - candidate) < 1e-6 for candidate in allowed)


def test_report_counts_equal_sql_and_percentiles_are_within_the_error(spark, seeded,
                                                                     tmp_path: Path):
    from django_mysqlq.contrib.spark import report

    result = report(spark, str(tmp_path), since=SINCE, until=UNTIL)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result.summary, default=str))
    assert summary["window"] == {"since": SINCE.isoformat(), "until": UNTIL.isoformat()}
    expected = sql_counts(SINCE, UNTIL)
    got = {(row["queue"], row["task_name"]): row for row in summary["by_task"]}
    assert set(got) == set(expected)
    for key, counts in expected.items():
        assert {name: got[key][name] for name in counts} == counts, key
        finished = counts["succeeded"] + counts["failed"]
        assert got[key]["success_rate"] == pytest.approx(counts["succeeded"] / finished)
        for kind in ("wait", "run"):
            exact = durations_ms(SINCE, UNTIL, *key, kind)
            for percentile in (0.5, 0.95, 0.99):
                value = got[key][f"{kind}_ms_p{round(percentile * 100)}"]
                assert _within_rank_error(value, exact, percentile), (key, kind, percentile)
    totals = summary["totals"]
    for name in ("attempts", "succeeded", "retried", "failed", "lost", "cancelled"):
        assert totals[name] == sum(counts[name] for counts in expected.values()), name
    assert summary["percentiles"]["relative_rank_error"] == pytest.approx(1e-4)
    assert summary["top_errors"][0]["count"] >= summary["top_errors"][-1]["count"]
    assert {error["error_class"] for error in summary["top_errors"]} == {"ValueError",
                                                                         "TimeoutError"}
    # Times are UTC with their offset, like the window (PySpark collects timestamps as naive
    # local times, and Django sets the process's TZ to TIME_ZONE: Chicago here).
    stamps = [error["last_seen"] for error in summary["top_errors"]] + [
        row["finished_at"] for row in summary["slowest_attempts"]]
    assert stamps and all(stamp.endswith("+00:00") for stamp in stamps), stamps
    assert all(SINCE <= dt.datetime.fromisoformat(stamp) < UNTIL for stamp in stamps), stamps


def test_report_files_and_filters(spark, seeded, tmp_path: Path, capsys):
    call_command("queuepipeline", "report", "--since", SINCE.isoformat(), "--until",
                 UNTIL.isoformat(), "--queue", QUEUES[0], "--task", TASKS[0], "--output",
                 str(tmp_path))
    out = capsys.readouterr().out
    assert "attempts of" in out and "summary.json" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(row["queue"], row["task_name"]) for row in summary["by_task"]] == [
        (QUEUES[0], TASKS[0])]
    assert summary["totals"]["attempts"] == sql_counts(SINCE, UNTIL)[(QUEUES[0], TASKS[0])][
        "attempts"]
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4 and "<script" not in html
    import pyarrow.parquet as pq

    for name in ("by_task", "by_queue", "totals", "timeseries", "errors", "slowest_attempts"):
        assert (tmp_path / name).is_dir(), name
    series = pq.read_table(tmp_path / "timeseries").to_pylist()
    assert sum(row["count"] for row in series) == summary["totals"]["attempts"] + summary[
        "totals"]["cancelled"]


def test_report_rejects_an_empty_window_and_writes_nothing(spark, tmp_path: Path):
    target = tmp_path / "out"
    with pytest.raises(CommandError, match=r"--since .* must be before --until"):
        call_command("queuepipeline", "report", "--since", "1h", "--until", "2h",
                     "--output", str(target))
    assert not target.exists()
    with pytest.raises(CommandError, match="expected KEY=VALUE"):
        call_command("queuepipeline", "report", "--conf", "spark.x", "--output", str(target))
    assert not target.exists()
