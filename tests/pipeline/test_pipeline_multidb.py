"""The pipeline over queues on two database servers (tests/multidb_support.py): ``report
--all-databases`` counts the history of both, and enqueue and replay write a queue's
messages on its own database."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_mysqlq.models import Attempt
from tests import multidb_support as mdb

from .support import NOW, seed_history

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True, databases="__all__")]

B = mdb.ALIAS_B
QUEUE_B = "mdb_b"


def _clear_b() -> None:
    for table in ("mysqlq_attempt", "mysqlq_message"):
        mdb.query(B, f"DELETE FROM {table}")


@pytest.fixture(autouse=True)
def queues_on_two_servers(second_server: None, settings: Any) -> Iterator[None]:
    settings.MYSQLQ = {**settings.MYSQLQ, "QUEUES": {QUEUE_B: {"DATABASE": B}}}
    _clear_b()
    yield
    _clear_b()


def _count(alias: str, table: str, where: str = "1") -> int:
    [(found,)] = mdb.query(alias, f"SELECT COUNT(*) FROM {table} WHERE {where}")
    return int(found)


def test_report_all_databases_counts_the_history_of_both_servers(spark, tmp_path: Path):
    from django_mysqlq.contrib.spark import PipelineError, report

    start = NOW - dt.timedelta(hours=3)
    seed_history(40, start=start, span=dt.timedelta(hours=1))
    rows = [Attempt(message_id=9_000 + n, queue=QUEUE_B, task_name="shop.render", attempt=1,
                    outcome="failed" if n % 4 == 0 else "succeeded", priority=0,
                    enqueued_at=start, started_at=start, worker_id="w",
                    finished_at=start + dt.timedelta(minutes=n)) for n in range(24)]
    Attempt.objects.using(B).bulk_create(rows)
    here = _count("default", "mysqlq_attempt", "outcome IN ('succeeded', 'retried', "
                  "'failed', 'lost')")
    assert _count(B, "mysqlq_attempt") == 24
    result = report(spark, str(tmp_path / "all"), since=NOW - dt.timedelta(hours=4),
                    until=NOW, all_databases=True)
    split = {row["database"]: row for row in result.summary["by_database"]}
    assert split["default"]["attempts"] == here
    assert split[B]["attempts"] == 24 and split[B]["failed"] == 6
    assert result.summary["totals"]["attempts"] == here + 24
    assert result.summary["sources"]["databases"] == ["default", B]
    assert any(row["queue"] == QUEUE_B for row in result.summary["by_task"])
    # One database at a time, as before: only its rows.
    one = report(spark, str(tmp_path / "b"), since=NOW - dt.timedelta(hours=4), until=NOW,
                 database_alias=B)
    assert one.summary["totals"]["attempts"] == 24
    with pytest.raises(PipelineError, match="--all-databases reads every"):
        report(spark, str(tmp_path / "x"), all_databases=True, archive=str(tmp_path))


def test_enqueue_to_a_queue_on_the_second_server_writes_there(spark):
    from django_mysqlq.contrib.spark import PipelineError, enqueue

    frame = spark.createDataFrame([(f"row-{n}",) for n in range(30)], "label string")
    result = enqueue(frame, "tests.testapp.tasks.record", args=["label"], queue=QUEUE_B)
    assert result.enqueued == 30
    assert _count(B, "mysqlq_message", f"queue = '{QUEUE_B}'") == 30
    assert _count("default", "mysqlq_message") == 0
    with pytest.raises(PipelineError, match="lives on database 'queues_b', not 'default'"):
        enqueue(frame, "tests.testapp.tasks.record", args=["label"], queue=QUEUE_B,
                database_alias="default")
    assert _count(B, "mysqlq_message") == 30


def test_an_archive_root_serves_one_database(spark, tmp_path: Path):
    """Ids of two databases overlap: a root archived from one is refused for the other
    (a run there would finish, and delete, the first one's batches)."""
    from django_mysqlq.contrib.spark import PipelineError, archive

    archive(spark, str(tmp_path), dt.timedelta(days=1))
    with pytest.raises(PipelineError, match="give each database its own --to"):
        archive(spark, str(tmp_path), dt.timedelta(days=1), database_alias=B)
    archive(spark, str(tmp_path / "b"), dt.timedelta(days=1), database_alias=B)


def test_replay_of_a_queue_on_the_second_server_writes_the_copies_there(spark, capsys):
    """``queuepipeline replay --queue mdb_b``: B's history is read, the copies and their
    ``replayed`` rows (``replayed_from``: the link to the original) are written on B."""
    from django.core.management import call_command

    start = NOW - dt.timedelta(hours=2)
    rows = [Attempt(message_id=5_000 + n, queue=QUEUE_B, task_name="tests.testapp.tasks.record",
                    attempt=1, outcome="failed" if n % 2 else "succeeded", priority=n % 3,
                    enqueued_at=start, started_at=start, worker_id="w",
                    finished_at=start + dt.timedelta(minutes=n),
                    payload=f'{{"args": ["b{n}"], "kwargs": {{}}}}') for n in range(8)]
    Attempt.objects.using(B).bulk_create(rows)
    failed = {row.message_id: row for row in rows if row.outcome == "failed"}
    here = _count("default", "mysqlq_message")
    call_command("queuepipeline", "replay", "--queue", QUEUE_B, "--since", "1d")
    assert f"Replayed {len(failed)} message(s)" in capsys.readouterr().out
    copies = mdb.query(B, "SELECT id, dedup_key, queue, priority, payload FROM mysqlq_message")
    assert sorted(int(key[len("replay:"):]) for _, key, *_ in copies) == sorted(failed)
    for copy_id, key, queue, priority, payload in copies:
        original = failed[int(key[len("replay:"):])]
        assert (queue, priority, payload) == (QUEUE_B, original.priority, original.payload)
        [(linked,)] = mdb.query(B, "SELECT replayed_from FROM mysqlq_attempt WHERE "
                                "message_id = %s AND outcome = 'replayed'", [copy_id])
        assert linked == original.message_id
    assert _count("default", "mysqlq_message") == here  # nothing on the other server
    assert _count("default", "mysqlq_attempt", "outcome = 'replayed'") == 0
    call_command("queuepipeline", "replay", "--queue", QUEUE_B, "--since", "1d")
    assert "Replayed 0 message(s)" in capsys.readouterr().out  # linked: never twice


def test_report_of_a_queue_on_the_second_server_reads_its_database(spark, tmp_path: Path,
                                                                    capsys):
    """``--database`` defaults to the queue's own: ``report --queue`` of a queue that
    lives on the second server reads that server's history, not ``MYSQLQ['DATABASE']``."""
    from django.core.management import CommandError, call_command

    start = NOW - dt.timedelta(hours=3)
    seed_history(10, start=start, span=dt.timedelta(hours=1))
    Attempt.objects.using(B).bulk_create([
        Attempt(message_id=9_500 + n, queue=QUEUE_B, task_name="shop.render", attempt=1,
                outcome="succeeded", priority=0, enqueued_at=start, started_at=start,
                worker_id="w", finished_at=start + dt.timedelta(minutes=n))
        for n in range(7)])
    call_command("queuepipeline", "report", "--since", "4h", "--queue", QUEUE_B,
                 "--conf", "spark.ui.enabled=false", "--output", str(tmp_path / "b"))
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["totals"]["attempts"] == 7
    assert [(row["queue"], row["succeeded"]) for row in summary["by_task"]] == [(QUEUE_B, 7)]
    with pytest.raises(CommandError, match="several databases"):
        call_command("queuepipeline", "report", "--queue", f"{QUEUE_B},emails",
                     "--output", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


def test_report_reads_the_replica_of_read_database(spark, settings, tmp_path: Path):
    """``MYSQLQ['READ_DATABASE']``: the report's reads go to the replica alias (here the
    second server stands in for one: its rows differ, so the counts tell which was read)."""
    from django_mysqlq.contrib.spark import report

    start = NOW - dt.timedelta(hours=3)
    seed_history(10, start=start, span=dt.timedelta(hours=1))
    Attempt.objects.using(B).bulk_create([
        Attempt(message_id=9_700 + n, queue="default", task_name="shop.render", attempt=1,
                outcome="succeeded", priority=0, enqueued_at=start, started_at=start,
                worker_id="w", finished_at=start + dt.timedelta(minutes=n))
        for n in range(5)])
    settings.MYSQLQ = {**settings.MYSQLQ, "READ_DATABASE": {"default": B}}
    result = report(spark, str(tmp_path / "r"), since=NOW - dt.timedelta(hours=4), until=NOW)
    assert result.summary["totals"]["attempts"] == 5
    assert [row["task_name"] for row in result.summary["by_task"]] == ["shop.render"]


def test_report_on_a_replica_reads_the_archive_of_its_queue_database(spark, settings,
                                                                      tmp_path: Path):
    """An archive root names the queue database its archive ran on; a report reading
    that database's replica (``READ_DATABASE``) reads the root too, another's is refused."""
    from django_mysqlq.contrib.spark import PipelineError, archive, report

    seed_history(6, start=NOW - dt.timedelta(days=3), span=dt.timedelta(hours=1))
    archive(spark, str(tmp_path / "a"), dt.timedelta(days=1))
    archive(spark, str(tmp_path / "b"), dt.timedelta(days=1), database_alias=B)
    settings.MYSQLQ = {**settings.MYSQLQ, "READ_DATABASE": {"default": B}}
    result = report(spark, str(tmp_path / "r"), since=NOW - dt.timedelta(days=4), until=NOW,
                    archive=str(tmp_path / "a"))
    assert result.summary["totals"]["attempts"] == 6
    with pytest.raises(PipelineError, match="holds the database"):
        report(spark, str(tmp_path / "x"), since=NOW - dt.timedelta(days=4), until=NOW,
               archive=str(tmp_path / "b"))
