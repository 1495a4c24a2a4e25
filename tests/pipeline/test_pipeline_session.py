"""The settings every pipeline session gets, and the archive's read-back of its files."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")


def test_a_local_driver_jvm_compiles_with_c1_and_keeps_utc():
    from django_mysqlq.contrib.spark.session import session_conf

    options = session_conf("local[*]")["spark.driver.extraJavaOptions"].split()
    assert "-XX:TieredStopAtLevel=1" in options and "-Duser.timezone=UTC" in options


def test_a_cluster_driver_gets_no_compiler_option_and_the_callers_conf_wins():
    from django_mysqlq.contrib.spark.session import session_conf

    assert "TieredStopAtLevel" not in session_conf("yarn")["spark.driver.extraJavaOptions"]
    mine = "-Duser.timezone=UTC -Xmx8g"
    assert session_conf("local[2]", {"spark.driver.extraJavaOptions": mine})[
        "spark.driver.extraJavaOptions"] == mine


@pytest.mark.spark
def test_read_back_sums_each_day_and_queue_and_returns_every_id_sorted(spark):
    """What verification compares with the source and what the delete removes come from
    one read of the files: exact per partition, every id once, in order."""
    import datetime as dt

    from django_mysqlq.contrib.spark.batches import read_back

    utc = dt.UTC
    rows = [(9, dt.date(2026, 1, 1), "a", dt.datetime(2026, 1, 1, 5, tzinfo=utc)),
            (3, dt.date(2026, 1, 1), "a", dt.datetime(2026, 1, 1, 1, tzinfo=utc)),
            (4, dt.date(2026, 1, 1), "b", dt.datetime(2026, 1, 1, 2, tzinfo=utc)),
            (7, dt.date(2026, 1, 2), "a", dt.datetime(2026, 1, 2, 23, 59, 59, 999999,
                                                      tzinfo=utc))]
    frame = spark.createDataFrame(rows, "id long, day date, queue string, "
                                        "finished_at timestamp").repartition(3)
    written = read_back(frame, "history")
    assert written.stats == {("2026-01-01", "a"): (2, 12, 3, 9),
                             ("2026-01-01", "b"): (1, 4, 4, 4),
                             ("2026-01-02", "a"): (1, 7, 7, 7)}
    assert written.span == (dt.datetime(2026, 1, 1, 1, tzinfo=utc),
                            dt.datetime(2026, 1, 2, 23, 59, 59, 999999, tzinfo=utc))
    assert written.ids == [3, 4, 7, 9]
    empty = read_back(frame.limit(0), "history")
    assert empty == type(empty)({}, None, [])
