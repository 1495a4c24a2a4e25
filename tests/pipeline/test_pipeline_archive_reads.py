"""What ``report`` and ``replay`` read from an archive root: the rows of their window
(however its bounds are written), and only from a root of their own database."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from django_mysqlq.models import Attempt

from .support import NOW, seed_history

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

#: A UTC day well before the cut-off, and its first hours (in New York, still the day
#: before: 01:00 UTC is 20:00 or 21:00 there).
DAY = (NOW - dt.timedelta(days=10)).date()
EARLY = dt.datetime.combine(DAY, dt.time(1), tzinfo=dt.UTC)
NEW_YORK = dt.timezone(dt.timedelta(hours=-5))


def test_a_window_bound_in_another_time_zone_reads_the_archived_days_it_covers(
        spark, tmp_path: Path):
    """``--until 23:00-05:00`` is 04:00 UTC of the next day: rows archived under that UTC
    day and finished before it are in the window (the day filter uses UTC dates)."""
    from django_mysqlq.contrib.spark import archive
    from django_mysqlq.contrib.spark.sources import archived_history

    seed_history(4, start=EARLY, span=dt.timedelta(minutes=40))
    ids = sorted(Attempt.objects.values_list("id", flat=True))
    archive(spark, str(tmp_path), dt.timedelta(days=1))
    assert not Attempt.objects.exists()
    until = dt.datetime.combine(DAY - dt.timedelta(days=1), dt.time(23), tzinfo=NEW_YORK)
    since = dt.datetime.combine(DAY - dt.timedelta(days=1), dt.time(12), tzinfo=NEW_YORK)
    assert since < EARLY < until
    frame = archived_history(spark, str(tmp_path), since, until, ["id"])
    assert frame is not None
    assert sorted(row["id"] for row in frame.collect()) == ids
    # The same window written in UTC reads the same rows.
    frame = archived_history(spark, str(tmp_path), since.astimezone(dt.UTC),
                             until.astimezone(dt.UTC), ["id"])
    assert frame is not None
    assert sorted(row["id"] for row in frame.collect()) == ids


def test_report_and_replay_refuse_an_archive_of_another_database(spark, tmp_path: Path):
    """Ids of two databases overlap: history archived from another database would be
    counted as this one's, and replay would copy its messages here."""
    from django_mysqlq.contrib.spark import PipelineError, replay, report

    seed_history(8, start=NOW - dt.timedelta(hours=2), span=dt.timedelta(hours=1))
    owner = tmp_path / "_mysqlq" / "database"
    owner.parent.mkdir(parents=True)
    owner.write_text("db.elsewhere.example:3306/shop_eu\n")
    with pytest.raises(PipelineError, match=r"holds the database db\.elsewhere"):
        report(spark, str(tmp_path / "out"), since=NOW - dt.timedelta(hours=3), until=NOW,
               archive=str(tmp_path))
    with pytest.raises(PipelineError, match=r"holds the database db\.elsewhere"):
        replay(spark, since=NOW - dt.timedelta(hours=3), archive=str(tmp_path),
               dry_run=True)
    assert not (tmp_path / "out").exists()
