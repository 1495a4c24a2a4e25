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


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["history", "topics"])
def test_the_local_read_back_gives_what_the_spark_one_gives(spark, tmp_path, kind):
    """Verification of local files reads them with pyarrow instead of a Spark job: same
    sums, span and ids, partition values Spark escaped in directory names included."""
    import datetime as dt

    from django_mysqlq.contrib.spark.batches import read_back, read_back_local

    utc = dt.UTC
    group = "queue" if kind == "history" else "topic"
    names = ["plain", "group:billing", "a/b c%d", "ünï ✓", "x=y"]
    rows = [(n * 7 + 3, dt.date(2026, 1, 1 + n % 3), names[n % len(names)],
             dt.datetime(2026, 1, 1 + n % 3, n % 24, n % 60, 0, n, tzinfo=utc), n)
            for n in range(500)]
    frame = spark.createDataFrame(rows, f"id long, day date, {group} string, "
                                        "finished_at timestamp, offset long")
    frame.repartition(3).write.partitionBy("day", group).parquet(str(tmp_path / "files"))
    written = spark.read.option("basePath", str(tmp_path / "files")) \
        .parquet(str(tmp_path / "files"))
    by_spark = read_back(written, kind)
    by_arrow = read_back_local(str(tmp_path / "files"), kind)
    assert by_arrow == by_spark
    assert {queue for _, queue in by_arrow.stats} == set(names)
    assert len(by_arrow.ids) == 500
    (tmp_path / "empty").mkdir()
    assert read_back_local(str(tmp_path / "empty"), kind) == type(by_arrow)({}, None, [])


@pytest.mark.spark
def test_the_local_store_lists_checks_and_renames_as_hadoop_does(spark, tmp_path):
    from django_mysqlq.contrib.spark.store import Store

    spark.range(50).repartition(2).write.parquet(str(tmp_path / "data" / "day=x"))
    (tmp_path / "data" / ".hidden.crc").write_text("")
    local, hadoop = Store(spark, str(tmp_path)), Store(spark, str(tmp_path))
    hadoop.local = False
    assert local.local and local.os_path(f"file://{tmp_path}/a%20b") == f"{tmp_path}/a b"
    assert local.os_path("s3a://bucket/x") is None and hadoop.os_path(str(tmp_path)) is None
    for root in (str(tmp_path / "data"), f"file://{tmp_path}/data"):
        assert local.list_files(root) == hadoop.list_files(root) != []
    assert local.list_files(str(tmp_path / "nowhere")) == []
    first = local.list_files(str(tmp_path / "data"))[0]
    source, target = str(tmp_path / "data" / first), str(tmp_path / "moved" / "deep" / "f")
    assert local.exists(source) and not local.exists(target)
    assert local.rename(source, target) and hadoop.exists(target)
    assert not local.rename(source, target)  # the source is gone
