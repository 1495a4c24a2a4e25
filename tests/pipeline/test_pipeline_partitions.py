"""``archive`` on a partitioned history table: partitions wholly past the cut-off are
archived, verified and dropped whole; every other old row is deleted row by row; a kill
at any step, the drop's included, and a re-run leave every archived row in the archive
exactly once and nothing dropped that is not in it."""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import MySQLdb
import pytest
from django.core.management import call_command
from django.db import connection

from django_mysqlq.broker import partitions
from django_mysqlq.models import Attempt

from ..conftest import wait_for
from .support import NOW, seed_history
from .test_pipeline_archive import OLD_START, _archived_ids, _invariant, _old_ids, _run_archive

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

CUTOFF = NOW - dt.timedelta(hours=20)


def _ids() -> list[int]:
    return sorted(Attempt.objects.values_list("id", flat=True))


@pytest.fixture
def unpartitioned() -> Iterator[None]:
    partitions.unpartition()
    yield
    connection.close()
    partitions.unpartition()


@pytest.fixture
def layout(unpartitioned) -> dict[str, Any]:
    """600 old rows (days 5..2 ago) and 100 from the last hours, partitioned so that the
    partition holding the first new row holds old rows too."""
    seed_history(600, start=OLD_START, span=dt.timedelta(days=3))
    seed_history(100, start=NOW - dt.timedelta(hours=5), span=dt.timedelta(hours=4),
                 message_base=500_000)
    old = _old_ids(CUTOFF)
    first_new = old[-1] + 1
    width = 150 if first_new % 150 else 140
    partitions.partition(width)
    found = partitions.layout()
    assert found is not None
    whole = [p.name for p in found if p.high is not None and p.high <= first_new]
    [mixed] = [p for p in found if p.high is not None and p.low < first_new < p.high]
    return {"old": old, "new": sorted(set(_ids()) - set(old)), "whole": whole,
            "mixed": mixed, "width": width}


def test_whole_old_partitions_are_dropped_and_the_rest_deleted_row_by_row(
        spark, layout, tmp_path: Path, capsys):
    from django_mysqlq.contrib.spark import archive

    dry = archive(spark, str(tmp_path), dt.timedelta(days=1), dry_run=True)
    assert dry.dropped == layout["whole"] and len(layout["whole"]) >= 3
    in_whole = [i for i in layout["old"] if i < layout["mixed"].low]
    assert dry.rows_in_dropped == len(in_whole) and dry.rows["history"] == len(layout["old"])
    call_command("queuepipeline", "archive", "--older-than", "1d", "--to", str(tmp_path),
                 "--dry-run")
    out = capsys.readouterr().out
    assert (f"{len(in_whole)} of the history rows are in partition(s) "
            f"{', '.join(layout['whole'])}, which would be dropped whole; "
            f"{len(layout['old']) - len(in_whole)} would be deleted row by row") in out
    assert _ids() == sorted(layout["old"] + layout["new"])

    result = archive(spark, str(tmp_path), dt.timedelta(days=1), batch_rows=100)
    assert _archived_ids(tmp_path) == layout["old"]
    assert _ids() == layout["new"]
    assert result.dropped == layout["whole"] and result.not_dropped == {}
    assert result.deleted == {"history": len(layout["old"])}
    names = [p.name for p in partitions.layout() or []]
    assert not set(layout["whole"]) & set(names)
    # The partition holding new rows too: its old rows deleted one by one, it stays.
    assert layout["mixed"].name in names
    again = archive(spark, str(tmp_path), dt.timedelta(days=1))
    assert again.rows == {"history": 0} and again.dropped == []
    assert _archived_ids(tmp_path) == layout["old"]


def test_rows_past_the_partitions_are_archived_row_by_row_and_pmax_kept(
        spark, unpartitioned, tmp_path: Path):
    from django_mysqlq.contrib.spark import archive

    seed_history(200, start=OLD_START, span=dt.timedelta(days=1))
    partitions.partition(100, ahead=1)
    # More ids than the partitions ahead hold: the rest reach pmax.
    seed_history(400, start=OLD_START + dt.timedelta(days=1), span=dt.timedelta(days=1))
    seed_history(50, start=NOW - dt.timedelta(hours=5), span=dt.timedelta(hours=4),
                 message_base=500_000)
    old = _old_ids(CUTOFF)
    new = sorted(set(_ids()) - set(old))
    before = [p.name for p in partitions.layout() or []]
    pmax = (partitions.layout() or [])[-1]
    assert Attempt.objects.filter(id__gte=pmax.low, id__lt=new[0]).count() > 200
    lines: list[str] = []
    result = archive(spark, str(tmp_path), dt.timedelta(days=1), batch_rows=120,
                     progress=lines.append)
    assert _archived_ids(tmp_path) == old and _ids() == new
    assert result.dropped and all(p != "pmax" for p in result.dropped)
    assert [p.name for p in partitions.layout() or []] == [
        name for name in before if name not in result.dropped]
    # New rows are in pmax: it is not split (that would copy them), and the run says so.
    assert result.partitions_added == []
    assert any("rows have reached mysqlq_attempt's pmax" in line for line in lines), lines


def test_a_held_table_makes_the_archive_delete_rows_instead_of_waiting(
        spark, layout, tmp_path: Path, monkeypatch):
    from django_mysqlq.contrib.spark import archive

    real = partitions.drop_archived
    monkeypatch.setattr(partitions, "drop_archived", lambda *a, **k: real(
        *a, **{**k, "tries": 1, "pause": 0.0}))
    conf = connection.settings_dict
    stranger = MySQLdb.connect(host=conf["HOST"], port=int(conf["PORT"]), user=conf["USER"],
                               password=conf["PASSWORD"], database=conf["NAME"])
    try:
        cursor = stranger.cursor()
        cursor.execute("START TRANSACTION")
        cursor.execute("SELECT id FROM mysqlq_attempt ORDER BY id LIMIT 1")
        started = time.monotonic()
        result = archive(spark, str(tmp_path), dt.timedelta(days=1), batch_rows=100)
        took = time.monotonic() - started
    finally:
        stranger.close()
    assert result.dropped == []
    assert result.not_dropped == dict.fromkeys(layout["whole"], "locked")
    assert _archived_ids(tmp_path) == layout["old"] and _ids() == layout["new"]
    assert set(layout["whole"]) <= {p.name for p in partitions.layout() or []}
    assert took < 60
    # The next run (nobody holding the table) drops the partitions the rows left empty.
    again = archive(spark, str(tmp_path), dt.timedelta(days=1))
    assert again.rows == {"history": 0}
    assert not set(layout["whole"]) & {p.name for p in partitions.layout() or []}


def test_archive_killed_around_the_drop_then_rerun_is_exactly_once(
        layout, tmp_path: Path, worker_env):
    """SIGKILL after the batch that is a partition was verified and committed, just
    before its drop, and just after it; each re-run finishes what the last one left."""
    pytest.importorskip("pyspark")
    marker = tmp_path / "paused"
    root = tmp_path / "archive"
    for step in ("verified", "committed", "dropping", "dropped"):
        marker.unlink(missing_ok=True)
        process = _run_archive(worker_env, root, step, marker)
        wait_for(lambda process=process: marker.exists() or process.poll() is not None,
                 timeout=120, message=f"the archive to reach {step}")
        assert process.poll() is None, f"the archive ended before {step}"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        time.sleep(0.2)
        _invariant(root, layout["old"])
    process = _run_archive(worker_env, root, None, marker)
    assert process.wait(timeout=180) == 0
    assert _archived_ids(root) == layout["old"]
    assert _ids() == layout["new"]
    assert not set(layout["whole"]) & {p.name for p in partitions.layout() or []}
