"""``queuepipeline enqueue``: a message per row, never twice, bad input refused early."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_mysqlq.models import Message

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

TASK = "tests.testapp.tasks.record"


def _parquet(path: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"label": [f"row-{n}" for n in range(rows)],
                             "value": list(range(rows))}), path)
    return path


def _payloads() -> list[dict]:
    return [json.loads(text) for text in Message.objects.values_list("payload", flat=True)]


def test_enqueue_from_parquet_then_again_adds_nothing(spark, tmp_path: Path, capsys):
    source = _parquet(tmp_path / "in.parquet", 300)
    call_command("queuepipeline", "enqueue", "--task", TASK, "--input", str(source),
                 "--args", "label", "--kwargs", "value=value", "--queue", "bulk",
                 "--priority", "7", "--delay", "1h")
    assert "Enqueued 300 message(s)" in capsys.readouterr().out
    messages = list(Message.objects.all())
    assert len(messages) == 300
    assert {(m.queue, m.priority, m.status, m.task_name) for m in messages} == {
        ("bulk", 7, "scheduled", TASK)}
    assert sorted(p["kwargs"]["value"] for p in _payloads()) == list(range(300))
    assert all(m.dedup_key and m.dedup_key.startswith("spark:") for m in messages)
    call_command("queuepipeline", "enqueue", "--task", TASK, "--input", str(source),
                 "--args", "label", "--kwargs", "value=value", "--queue", "bulk",
                 "--priority", "7", "--delay", "1h")
    assert "Enqueued 0 message(s)" in capsys.readouterr().out
    assert Message.objects.count() == 300


def test_a_spark_task_that_fails_after_writing_is_retried_without_duplicates(
        spark, tmp_path: Path, monkeypatch):
    """The first attempt of a writing task dies after the broker committed its first
    5,000 rows; Spark runs the task again (local[2,3]) and the dedup keys keep each row
    once."""
    from django.db import connection

    from django_mysqlq.contrib.spark import enqueue, fanout

    marker = tmp_path / "committed-before-failure"
    conf = dict(connection.settings_dict)
    connect = {"host": conf["HOST"], "port": int(conf["PORT"]), "user": conf["USER"],
               "password": conf["PASSWORD"], "database": conf["NAME"]}
    real_writer = fanout._writer

    def failing_writer(spec):
        write = real_writer(spec)

        def first_attempt_fails(batches):
            from pyspark import TaskContext

            context = TaskContext.get()
            doomed = context.partitionId() == 0 and context.attemptNumber() == 0

            def feed():
                for batch in batches:
                    yield batch.slice(0, 6000)
                    if doomed:  # the writer has flushed 5,000 rows and asks for more
                        import MySQLdb

                        db = MySQLdb.connect(autocommit=True, **connect)
                        cursor = db.cursor()
                        cursor.execute("SELECT COUNT(*) FROM mysqlq_message "
                                       "WHERE JSON_VALUE(payload, '$.kwargs.value') < 10000")
                        marker.write_text(str(cursor.fetchone()[0]))
                        db.close()
                        raise RuntimeError("this Spark task fails on its first attempt")
                    yield batch.slice(6000)

            yield from write(feed())

        return first_attempt_fails

    monkeypatch.setattr(fanout, "_writer", failing_writer)
    frame = (spark.range(0, 20_000, 1, 2)
             .selectExpr("concat('row-', id) AS label", "id AS value"))
    result = enqueue(frame, TASK, args=["label"], kwargs={"value": "value"},
                     max_connections=2)
    assert int(marker.read_text()) == 5000  # the failed attempt had committed rows
    assert result.rows == 20_000
    assert Message.objects.count() == 20_000
    values = [p["kwargs"]["value"] for p in _payloads()]
    assert sorted(values) == list(range(20_000))


def test_dedup_column_and_query_source(spark, tmp_path: Path):
    from django_mysqlq.contrib.spark import enqueue
    from django_mysqlq.contrib.spark.fanout import read_query

    frame = spark.createDataFrame([(1, "a"), (1, "b"), (2, "c")], "user long, note string")
    result = enqueue(frame, TASK, args=["note"], dedup_column="user")
    assert (result.enqueued, result.duplicates) == (2, 1)
    rows = read_query(spark, "SELECT id AS pk, task_name FROM mysqlq_message")
    assert enqueue(rows, TASK, kwargs={"label": "task_name", "value": "pk"}).enqueued == 2
    assert Message.objects.count() == 4


def test_values_that_cant_be_arguments_are_counted_with_a_sample(spark, tmp_path: Path):
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps({"label": f"r{n}", "value": n}) for n in range(5))
                    + '\n{"label": "bad", "value": 1e999}\n')
    frame_rows = 6
    with pytest.raises(CommandError, match=r"1 row\(s\) were not enqueued.*bad"):
        call_command("queuepipeline", "enqueue", "--task", TASK, "--input", str(data),
                     "--args", "label,value")
    assert Message.objects.count() == frame_rows - 1


@pytest.mark.parametrize(("options", "error"), [
    (["--task", "tests.testapp.tasks.recrod", "--args", "label"], "not a registered task"),
    (["--task", TASK, "--args", "label,nope"], r"Column\(s\) nope not in the input"),
    (["--task", TASK, "--args", "blob"], "blob is binary, which is not a JSON value"),
    (["--task", TASK, "--args", "when"], "when is timestamp"),
    (["--task", TASK, "--args", "label", "--queue", "a,b"], "--queue must be"),
    (["--task", TASK, "--args", "label", "--priority", "500"], "--priority must be"),
    (["--task", TASK], "Give the task's arguments"),
    # The mapping is checked against the task's signature: a typo would otherwise write
    # a message per row that fails on the worker with TypeError.
    (["--task", TASK, "--args", "label", "--kwargs", "vaule=label"],
     r"can't be called with these arguments: .*'vaule'.*nothing was enqueued"),
    (["--task", TASK, "--args", "label,label,label"], "can't be called with these"),
    # The bulk insert writes plain rows: a task whose messages pass a gate, wait for a
    # rate limit or keep a unique key is refused, not enqueued without them.
    (["--task", "tests.testapp.rated_tasks.per_minute", "--args", "label,label"],
     "rate_limit='100/m'"),
    (["--task", "tests.testapp.gated.ordered_step", "--args", "label,label,label"],
     "ordered_by"),
    (["--task", "tests.testapp.gated.limited_step", "--args", "label,label,label"],
     "concurrency_limit"),
    (["--task", "tests.testapp.unique_tasks.unique_while_queued", "--args", "label"],
     "unique_for"),
])
def test_bad_input_fails_before_writing_anything(spark, tmp_path: Path, options, error):
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    import tests.testapp.gated
    import tests.testapp.rated_tasks
    import tests.testapp.unique_tasks  # noqa: F401  (registers the tasks named above)

    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"label": ["x"], "blob": [b"\x00"],
                             "when": [dt.datetime(2026, 1, 1)]}), source)
    with pytest.raises(CommandError, match=error):
        call_command("queuepipeline", "enqueue", "--input", str(source), *options)
    assert Message.objects.count() == 0


def test_missing_input_is_named(spark, tmp_path: Path):
    with pytest.raises(CommandError, match="no such file"):
        call_command("queuepipeline", "enqueue", "--task", TASK, "--input",
                     str(tmp_path / "nope.parquet"), "--args", "label")


def test_command_line_query_csv_and_dedup_column(spark, tmp_path: Path, capsys):
    """``--query`` reads the database, ``--input`` a CSV; ``--dedup-column`` makes rows
    with the same value one message, on this run and the next."""
    data = tmp_path / "in.csv"
    data.write_text("user,note\nu1,a\nu1,b\nu2,c\n")
    call_command("queuepipeline", "enqueue", "--task", TASK, "--input", str(data),
                 "--args", "note", "--dedup-column", "user")
    assert "Enqueued 2 message(s)" in capsys.readouterr().out
    assert sorted(p["args"][0] for p in _payloads()) in (["a", "c"], ["b", "c"])
    call_command("queuepipeline", "enqueue", "--task", TASK, "--query",
                 "SELECT id AS pk, task_name FROM mysqlq_message",
                 "--kwargs", "label=task_name,value=pk", "--dedup-column", "pk")
    assert "Enqueued 2 message(s)" in capsys.readouterr().out
    assert Message.objects.count() == 4
    with pytest.raises(CommandError, match="--query failed"):
        call_command("queuepipeline", "enqueue", "--task", TASK, "--query",
                     "SELECT nope FROM mysqlq_message", "--args", "nope")
    assert Message.objects.count() == 4
