"""``queuepipeline archive --source topics``: topic messages every group has passed and
older than the cut-off go to Parquet by day and topic, exactly once (even when the
driver is SIGKILLed mid-run), and are deleted as retention deletes them (first_offset
moved, delivery links gone); a message a group has not passed stays."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_mysqlq import broker
from django_mysqlq.models import TopicDelivery, TopicMessage, TopicState
from tests.topic_ops_support import group, publish

from ..conftest import ROOT, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


def _age(topic: str, offsets: range, days: float) -> None:
    TopicMessage.objects.filter(topic=topic, offset__in=list(offsets)).update(
        published_at=NOW - dt.timedelta(days=days))


def _kept(topic: str) -> list[int]:
    return sorted(TopicMessage.objects.filter(topic=topic).values_list("offset", flat=True))


def _ids(topic: str, offsets: range) -> list[int]:
    return sorted(TopicMessage.objects.filter(topic=topic, offset__in=list(offsets))
                  .values_list("id", flat=True))


def _archived(root: Path) -> list[tuple[str, int, int]]:
    """``(topic, offset, id)`` of every archived topic message."""
    import pyarrow.dataset as ds

    path = root / "topics"
    if not path.exists():
        return []
    table = ds.dataset(str(path), format="parquet", partitioning="hive",
                       exclude_invalid_files=True).to_table(columns=["topic", "offset", "id"])
    return sorted(zip(table.column("topic").to_pylist(), table.column("offset").to_pylist(),
                      table.column("id").to_pylist(), strict=True))


@pytest.fixture
def topics() -> dict[str, list[int]]:
    """``orders``: 200 messages, 1..120 published 3-4 days ago, the rest now; its group
    ``billing`` has passed 1..150, ``audit`` 1..100 (so 1..100 may go). ``log.clicks``:
    no group, 80 messages, 1..60 two days ago (so 1..60 may go)."""
    billing = group("orders", "billing")
    audit = group("orders", "audit")
    publish("orders", 200)
    _age("orders", range(1, 61), days=4)
    _age("orders", range(61, 121), days=3)
    broker.pump(billing, batch=150, window=1000)
    broker.pump(audit, batch=100, window=1000)
    publish("log.clicks", 80)
    _age("log.clicks", range(1, 61), days=2)
    return {"orders": _ids("orders", range(1, 101)),
            "log.clicks": _ids("log.clicks", range(1, 61))}


def _payloads(topic: str) -> dict[int, str]:
    return dict(TopicMessage.objects.filter(topic=topic).values_list("offset", "payload"))


def _expected(old: dict[str, list[int]]) -> list[tuple[str, int, int]]:
    return sorted((topic, offset, pk) for topic, ids in old.items()
                  for offset, pk in TopicMessage.objects.filter(pk__in=ids)
                  .values_list("offset", "id"))


def test_topic_messages_every_group_passed_go_to_parquet_by_day_and_topic(
        spark, topics, tmp_path: Path):
    from django_mysqlq.contrib.spark import archive

    expected = _expected(topics)
    payloads = _payloads("orders")
    links_before = TopicDelivery.objects.filter(topic="orders", offset__lte=100).count()
    assert links_before == 200  # two groups' deliveries of 1..100
    result = archive(spark, str(tmp_path), dt.timedelta(days=1), sources=["topics"],
                     batch_rows=35, delete_batch=15)
    assert result.rows == {"topics": 160} and result.deleted == {"topics": 160}
    assert len(result.committed) == 3 + 2  # 100 offsets / 35, 60 / 35
    assert _archived(tmp_path) == expected
    # Kept: exactly what no group has passed yet or is too new; first_offset moved.
    assert _kept("orders") == list(range(101, 201))
    assert _kept("log.clicks") == list(range(61, 81))
    assert TopicState.objects.get(name="orders").first_offset == 101
    assert TopicState.objects.get(name="log.clicks").first_offset == 61
    assert not TopicDelivery.objects.filter(topic="orders", offset__lte=100).exists()
    assert TopicDelivery.objects.filter(topic="orders", group_name="billing").count() == 50
    # Partitions: day of publish and topic; the dataset reads back with its schema.
    parts = {(day.name, part.name) for day in (tmp_path / "topics").iterdir()
             for part in day.iterdir()}
    days = {(NOW - dt.timedelta(days=n)).date() for n in (2, 3, 4)}
    assert {name for _, name in parts} == {"topic=orders", "topic=log.clicks"}
    assert {name for name, _ in parts} == {f"day={day}" for day in days}
    frame = spark.read.parquet(str(tmp_path / "topics"))
    assert {"id", "offset", "key", "payload", "published_at", "sequenced_at", "day",
            "topic"} <= set(frame.columns)
    row = frame.where("topic = 'orders' AND offset = 7").collect()[0]
    assert row["payload"] == payloads[7] and row["published_at"] is not None
    # History was not touched, and a second run finds nothing more.
    again = archive(spark, str(tmp_path), dt.timedelta(days=1), sources=["topics"])
    assert again.rows == {"topics": 0} and _archived(tmp_path) == expected
    # Once audit passes 101..150 (old enough: up to 120), those go too.
    broker.pump(group("orders", "audit"), batch=50, window=1000)
    later = archive(spark, str(tmp_path), dt.timedelta(days=1), sources=["topics"])
    assert later.rows == {"topics": 20}
    assert _kept("orders") == list(range(121, 201))


def test_dry_run_counts_and_changes_nothing(spark, topics, tmp_path: Path, capsys):
    # A first_offset that can't be true (by hand): a real run writes it back, not this.
    TopicState.objects.filter(name="orders").update(first_offset=0)
    call_command("queuepipeline", "archive", "--older-than", "1d", "--to", str(tmp_path),
                 "--source", "history,topics", "--dry-run")
    out = capsys.readouterr().out
    assert "160 topics row(s) published before" in out and "0 history row(s)" in out
    assert TopicMessage.objects.count() == 280
    assert not (tmp_path / "topics").exists()
    assert TopicState.objects.get(name="orders").first_offset == 0


def test_bad_topic_archive_input_is_refused(spark, topics, tmp_path: Path):
    from django_mysqlq.contrib.spark import PipelineError, archive

    with pytest.raises(CommandError, match="expected history, topics"):
        call_command("queuepipeline", "archive", "--older-than", "1d", "--to",
                     str(tmp_path), "--source", "topic")
    with pytest.raises(PipelineError, match="--source takes"):
        archive(spark, str(tmp_path), dt.timedelta(days=1), sources=["queues"])
    with pytest.raises(PipelineError, match="--include-dead goes with --source history"):
        archive(spark, str(tmp_path), dt.timedelta(days=1), sources=["topics"],
                include_dead=True)
    assert list(tmp_path.iterdir()) == []
    assert TopicMessage.objects.count() == 280


def _run(env: dict[str, str], root: Path, pause_at: str | None,
         marker: Path) -> subprocess.Popen[bytes]:
    env = dict(env)
    if pause_at:
        env.update(MYSQLQ_PIPELINE_PAUSE_AT=pause_at, MYSQLQ_PIPELINE_PAUSE_FILE=str(marker))
    log = ROOT / "test-output" / f"topic-archive-{pause_at}.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "queuepipeline", "archive", "--older-than", "1d",
             "--source", "topics", "--to", str(root), "--batch-rows", "40", "--delete-batch",
             "15", "--master", "local[2]", "--conf", "spark.ui.enabled=false"],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True)


def _invariant(root: Path, old: dict[str, list[int]]) -> None:
    """No message archived twice; every message gone from MySQL is in the archive; what
    is kept of a topic is first_offset … last, with no hole."""
    archived = _archived(root)
    assert len({pk for _, _, pk in archived}) == len(archived), "archived twice"
    remaining = set(TopicMessage.objects.values_list("id", flat=True))
    gone = {pk for ids in old.values() for pk in ids} - remaining
    assert gone <= {pk for _, _, pk in archived}, "deleted but never archived"
    for topic in old:
        kept = _kept(topic)
        first = TopicState.objects.get(name=topic).first_offset
        assert kept == list(range(kept[0], kept[-1] + 1)) and first <= kept[0]


def test_topic_archive_killed_at_every_step_then_rerun_is_exactly_once(
        topics, tmp_path: Path, worker_env):
    pytest.importorskip("pyspark")
    expected = _expected(topics)
    marker = tmp_path / "paused"
    root = tmp_path / "archive"
    for step in ("written", "committed", "renamed", "deleting"):
        marker.unlink(missing_ok=True)
        process = _run(worker_env, root, step, marker)
        wait_for(lambda process=process: marker.exists() or process.poll() is not None,
                 timeout=120, message=f"the archive to reach {step}")
        assert process.poll() is None, f"the archive ended before {step}"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        time.sleep(0.2)  # the server notices the dead connection (and frees the lock)
        _invariant(root, topics)
    process = _run(worker_env, root, None, marker)
    assert process.wait(timeout=180) == 0
    assert _archived(root) == expected
    assert _kept("orders") == list(range(101, 201))
    assert _kept("log.clicks") == list(range(61, 81))
    assert TopicState.objects.get(name="orders").first_offset == 101
    assert not TopicDelivery.objects.filter(topic="orders", offset__lte=100).exists()
    staged = root / "_mysqlq" / "staging"
    assert not staged.exists() or list(staged.iterdir()) == []
