"""``queuepipeline archive``: every archived row in Parquet exactly once, and deleted from
MySQL only once it is there, even when the driver is killed with SIGKILL mid-run."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_mysqlq.models import Attempt, Message

from ..conftest import ROOT, wait_for
from .support import NOW, seed_history, sql_counts

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

OLD_START = NOW - dt.timedelta(days=5)


def _archived_ids(root: Path, kind: str = "history") -> list[int]:
    import pyarrow.dataset as ds

    path = root / kind
    if not path.exists():
        return []
    dataset = ds.dataset(str(path), format="parquet", partitioning="hive",
                         exclude_invalid_files=True)
    return sorted(dataset.to_table(columns=["id"]).column("id").to_pylist())


def _old_ids(before: dt.datetime) -> list[int]:
    return sorted(Attempt.objects.filter(finished_at__lt=before).values_list("id", flat=True))


@pytest.fixture
def history() -> dict[str, list[int]]:
    """600 rows over days 5..2 ago (archived by --older-than 1d) and 100 from the last
    hours (kept)."""
    seed_history(600, start=OLD_START, span=dt.timedelta(days=3))
    seed_history(100, start=NOW - dt.timedelta(hours=5), span=dt.timedelta(hours=4),
                 message_base=500_000)
    cutoff = NOW - dt.timedelta(hours=20)
    return {"old": _old_ids(cutoff), "new": sorted(set(Attempt.objects.values_list(
        "id", flat=True)) - set(_old_ids(cutoff)))}


def test_archive_moves_old_rows_to_parquet_by_day_and_queue(spark, history, tmp_path: Path):
    from django_mysqlq.contrib.spark import archive, report

    before = sql_counts(OLD_START, NOW)
    result = archive(spark, str(tmp_path), dt.timedelta(days=1), batch_rows=150)
    assert len(result.committed) > 2  # several batches
    assert _archived_ids(tmp_path) == history["old"]
    assert sorted(Attempt.objects.values_list("id", flat=True)) == history["new"]
    assert result.rows == {"history": len(history["old"])}
    assert result.deleted == {"history": len(history["old"])}
    days = {path.name for path in (tmp_path / "history").iterdir()}
    assert days == {f"day={(OLD_START + dt.timedelta(days=n)).date()}" for n in range(4)} - {
        f"day={(OLD_START + dt.timedelta(days=3)).date()}"} | days & {
        f"day={(OLD_START + dt.timedelta(days=3)).date()}"}
    # A whole day of the span has both queues. (Not any day: the first and the last are
    # slivers when the run is near midnight UTC, down to a row or two of one queue.)
    whole_day = tmp_path / "history" / f"day={(OLD_START + dt.timedelta(days=1)).date()}"
    assert {p.name for p in whole_day.iterdir()} == {"queue=default", "queue=emails"}
    # Months of history no longer in MySQL are still reported: live + archive = before.
    after = report(spark, str(tmp_path / "report"), since=OLD_START, until=NOW,
                   archive=str(tmp_path))
    got = {(row["queue"], row["task_name"]): row for row in after.summary["by_task"]}
    for key, counts in before.items():
        assert {name: got[key][name] for name in counts} == counts
    # A second run finds nothing more to move.
    again = archive(spark, str(tmp_path), dt.timedelta(days=1))
    assert again.rows == {"history": 0} and _archived_ids(tmp_path) == history["old"]


def test_dry_run_changes_nothing(spark, history, tmp_path: Path, capsys):
    call_command("queuepipeline", "archive", "--older-than", "1d", "--to", str(tmp_path),
                 "--dry-run", "--include-dead")
    out = capsys.readouterr().out
    assert f"{len(history['old'])} history row(s)" in out and "would move" in out
    assert Attempt.objects.count() == len(history["old"]) + len(history["new"])
    assert not (tmp_path / "history").exists()


def test_include_dead_archives_old_dead_messages(spark, history, tmp_path: Path):
    from django_mysqlq.contrib.spark import archive

    def dead(run_at: dt.datetime, label: str) -> Message:
        return Message.objects.create(
            queue="default", task_name="tests.testapp.tasks.record", status="dead",
            payload=json.dumps({"args": [label], "kwargs": {}}), enqueued_at=run_at,
            run_at=run_at, attempts=3, max_attempts=3, retry_backoff=1.0, last_error="x")

    old = [dead(NOW - dt.timedelta(days=3), f"old-{n}").pk for n in range(5)]
    recent = dead(NOW - dt.timedelta(hours=1), "recent").pk
    ready = Message.objects.create(
        queue="default", task_name="tests.testapp.tasks.record", status="ready",
        payload="{}", enqueued_at=NOW - dt.timedelta(days=3), run_at=NOW - dt.timedelta(days=3),
        max_attempts=3, retry_backoff=1.0).pk
    # A dead head of an ordered subject holds it: only an operator may let it go.
    head = dead(NOW - dt.timedelta(days=3), "head")
    Message.objects.filter(pk=head.pk).update(gate_key="order:1", gate_mode="hold",
                                              gate_limit=1)
    result = archive(spark, str(tmp_path), dt.timedelta(days=1), include_dead=True)
    assert result.rows["dead"] == 5 and result.deleted["dead"] == 5
    assert _archived_ids(tmp_path, "dead") == sorted(old)
    assert sorted(Message.objects.values_list("pk", flat=True)) == sorted(
        [recent, ready, head.pk])


def test_a_second_archive_at_once_is_refused_and_writes_nothing(spark, history,
                                                               tmp_path: Path):
    import MySQLdb
    from django.db import connection

    from django_mysqlq.contrib.spark import PipelineError, archive

    conf = connection.settings_dict
    other = MySQLdb.connect(host=conf["HOST"], port=int(conf["PORT"]), user=conf["USER"],
                            password=conf["PASSWORD"], database=conf["NAME"])
    try:
        other.cursor().execute("SELECT GET_LOCK(CONCAT('mysqlq_archive:', DATABASE()), 0)")
        with pytest.raises(PipelineError, match="Another archive is running"):
            archive(spark, str(tmp_path), dt.timedelta(days=1))
    finally:
        other.close()
    assert not (tmp_path / "history").exists()
    assert Attempt.objects.count() == len(history["old"]) + len(history["new"])


def test_bad_archive_options_are_refused(spark, tmp_path: Path):
    with pytest.raises(CommandError, match="expected a duration"):
        call_command("queuepipeline", "archive", "--older-than", "soon", "--to",
                     str(tmp_path))
    with pytest.raises(CommandError, match="--database 'nope' is not in DATABASES"):
        call_command("queuepipeline", "archive", "--older-than", "1d", "--to",
                     str(tmp_path), "--database", "nope")
    assert list(tmp_path.iterdir()) == []


def _run_archive(env: dict[str, str], root: Path, pause_at: str | None,
                 marker: Path) -> subprocess.Popen[bytes]:
    env = dict(env)
    if pause_at:
        env.update(MYSQLQ_PIPELINE_PAUSE_AT=pause_at, MYSQLQ_PIPELINE_PAUSE_FILE=str(marker))
    log = (ROOT / "test-output" / f"archive-{pause_at}.log")
    log.parent.mkdir(exist_ok=True)
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "queuepipeline", "archive", "--older-than", "1d",
             "--to", str(root), "--batch-rows", "150", "--delete-batch", "20", "--master",
             "local[2]", "--conf", "spark.ui.enabled=false"],
            cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True)


def _invariant(root: Path, old: list[int]) -> None:
    """No archived row twice; every row gone from MySQL is in the archive."""
    archived = _archived_ids(root)
    assert len(archived) == len(set(archived)), "a row is in the archive twice"
    remaining = set(Attempt.objects.values_list("id", flat=True))
    assert set(old) - remaining <= set(archived), "a row was deleted but never archived"


def test_archive_killed_at_every_step_then_rerun_is_exactly_once(history, tmp_path: Path,
                                                                 worker_env):
    """The driver (Python and its JVM) is SIGKILLed at each step of a batch in turn; each
    re-run first finishes or drops what the previous one left."""
    pytest.importorskip("pyspark")
    marker = tmp_path / "paused"
    root = tmp_path / "archive"
    for step in ("written", "committed", "renamed", "deleting"):
        marker.unlink(missing_ok=True)
        process = _run_archive(worker_env, root, step, marker)
        wait_for(lambda process=process: marker.exists() or process.poll() is not None,
                 timeout=120,
                 message=f"the archive to reach {step}")
        assert process.poll() is None, f"the archive ended before {step}"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        time.sleep(0.2)  # the server notices the dead connection (and frees the lock)
        _invariant(root, history["old"])
    process = _run_archive(worker_env, root, None, marker)
    assert process.wait(timeout=180) == 0
    assert _archived_ids(root) == history["old"]
    assert sorted(Attempt.objects.values_list("id", flat=True)) == history["new"]
    staged = root / "_mysqlq" / "staging"
    assert not staged.exists() or list(staged.iterdir()) == []


def test_a_batch_whose_source_changed_is_dropped_not_deleted(spark, history, tmp_path: Path):
    """Verification compares the written files with MySQL: a row purged between the write
    and the check makes the batch fail it, and nothing of it is committed or deleted."""
    from django_mysqlq.contrib.spark.archiving import _frame
    from django_mysqlq.contrib.spark.batches import (
        Batch,
        BatchMismatch,
        Control,
        stage,
        verify,
    )
    from django_mysqlq.contrib.spark.database import database

    control = Control(spark, str(tmp_path))
    cutoff = NOW - dt.timedelta(hours=20)
    batch = Batch("history", history["old"][0], history["old"][-1] + 1, cutoff, "b-test")
    assert stage(control, batch, _frame(spark, database(), batch, None, None))
    Attempt.objects.filter(pk=history["old"][7]).delete()  # a purge, meanwhile
    with pytest.raises(BatchMismatch, match="disagree"):
        verify(control, batch, "default")
    assert control.records() == {}
    assert Attempt.objects.count() == len(history["old"]) + len(history["new"]) - 1


def test_a_range_delete_never_takes_a_row_that_was_not_archived(history):
    """The archive deletes a range of ids only if the range holds nothing but archived
    ids; a row inside it that was not archived (committed late) makes it fall back to
    deleting the list, and that row stays."""
    from django_mysqlq.broker.archive import delete_history

    old = history["old"]
    cutoff = NOW - dt.timedelta(hours=20)
    archived = [pk for pk in old[:50] if pk != old[10]]  # old[10] "was not archived"
    assert delete_history(archived, before=cutoff) == 49
    assert Attempt.objects.filter(pk=old[10]).exists()
    assert not Attempt.objects.filter(pk__in=archived).exists()
    assert delete_history(old[50:100], before=cutoff) == 50  # the fast path, all archived
    assert Attempt.objects.filter(pk__in=old[:100]).count() == 1


def test_files_and_records_reach_the_disk_before_rows_are_deleted(spark, history,
                                                                 tmp_path: Path,
                                                                 monkeypatch):
    """A power cut after a DELETE must not lose the only copy: each staged file and its
    directory are fsynced before the batch's record is written, and the record, its
    directory and the moved files' directories before the first DELETE."""
    import threading

    from django_mysqlq.broker import archive as statements
    from django_mysqlq.contrib.spark import archive
    from django_mysqlq.contrib.spark.store import Store

    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    real_fsync, real_write, real_delete = os.fsync, Store.write_text, \
        statements.delete_history

    def fsync(fd: int) -> None:
        with lock:
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def write_text(self: Store, path: str, text: str) -> None:
        with lock:
            events.append(("write", path))
        real_write(self, path, text)

    def delete_history(*args, **kwargs):
        with lock:
            events.append(("delete", ""))
        return real_delete(*args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Store, "write_text", write_text)
    monkeypatch.setattr(statements, "delete_history", delete_history)
    result = archive(spark, str(tmp_path), dt.timedelta(days=1), batch_rows=400)
    assert result.deleted == {"history": len(history["old"])}
    first_delete = events.index(("delete", ""))
    synced = [path for kind, path in events[:first_delete] if kind == "fsync"]
    first = result.committed[0]
    record_path = str(tmp_path / "_mysqlq" / "batches" / f"{first}.json")
    record = json.loads(Path(record_path).read_text())
    written = events.index(("write", record_path))
    before_record = [path for kind, path in events[:written] if kind == "fsync"]
    real = Path(os.path.realpath(tmp_path))  # what /proc names the synced files by
    staging = real / "_mysqlq" / "staging" / first
    for source, target in record["files"]:
        assert str(staging / source) in before_record
        assert str((staging / source).parent) in before_record
        assert str((real / target).parent) in synced
    assert str(staging) in before_record
    assert str(real / "_mysqlq" / "batches" / f"{first}.json") in synced
    assert str(real / "_mysqlq" / "batches") in synced
