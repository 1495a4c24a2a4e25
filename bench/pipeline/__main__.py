"""``python -m bench.pipeline``: the Spark pipeline on N history rows (default 1,000,000)
made in the real tables, each job beside the same work done without Spark.

    python -m bench.pipeline                 # 1M rows: about 10 minutes on 2 cores
    python -m bench.pipeline --rows 50000    # a quick look
    python -m bench.pipeline --only report,readers
    python -m bench.pipeline --only archive --archive-alone   # no worker beside it
    python -m bench.pipeline --only archive --partitioned 0  # the plain table only

Writes ``bench/results/pipeline-<run>.json`` and ``.md``. The database is
``mysqlq_pipeline_bench`` (``MYSQLQ_BENCH_DB`` and ``…_HOST/PORT/USER/PASSWORD``
override it); its queue tables are emptied first. Each job runs as ``manage.py
queuepipeline`` in a subprocess, so its time is end to end: Python, Django, the JVM.
The archive step also reports the CPU seconds of the command (every process of its
session: Python, the JVM), of the local MariaDB server and of the worker. It then runs
a second time on the same rows seeded again into a history table partitioned by
``--partitioned ROWS`` ids (default 250,000; 0: no second run; ``queuehistory
partition``; the conversion's time and server CPU reported apart), so that the archive
drops partitions instead of deleting rows; ``--partitioned-only`` skips the first,
plain, run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench" / "results"
STEPS = ("report", "readers", "archive", "enqueue")
#: The sections of the results (``--partitioned`` adds the second archive run).
SECTIONS = ("report", "readers", "archive", "archive_partitioned", "enqueue")
SETTINGS = "bench.pipeline.settings"
WORKER_FILL = 400_000
WORKER_WINDOW = 15.0


def log(message: str) -> None:
    print(f"[pipeline-bench] {message}", flush=True)


def command(args: list[str], log_path: Path) -> tuple[float, str]:
    """Run ``manage.py queuepipeline …`` in a subprocess; its wall time and stdout."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    with log_path.open("wb") as err:
        done = subprocess.run([sys.executable, "-m", "django", "queuepipeline", *args],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
                              timeout=1800)
    seconds = time.perf_counter() - started
    out = done.stdout.decode()
    if done.returncode != 0:
        raise SystemExit(f"queuepipeline {args[0]} failed ({done.returncode}): {out}\n"
                         f"{log_path.read_text()[-3000:]}")
    return seconds, out


def scalar(conn: Any, sql: str, params: Any = None) -> Any:
    cursor = conn.cursor()
    cursor.execute(sql, params)
    return cursor.fetchone()[0]


def timed_sql(conn: Any, sql: str) -> float:
    started = time.perf_counter()
    cursor = conn.cursor()
    cursor.execute(sql)
    cursor.fetchall()
    return time.perf_counter() - started


SQL_COUNTS = """
SELECT queue, task_name, SUM(outcome IN ('succeeded','retried','failed','lost')),
       COUNT(DISTINCT message_id), SUM(outcome = 'succeeded'), SUM(outcome = 'retried'),
       SUM(outcome = 'failed'), SUM(outcome = 'lost'), SUM(outcome = 'cancelled')
  FROM mysqlq_attempt WHERE finished_at >= UTC_TIMESTAMP() - INTERVAL 1 DAY
 GROUP BY queue, task_name"""
SQL_PERCENTILES = """
SELECT DISTINCT queue, task_name,
       PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY w) OVER (PARTITION BY queue, task_name),
       PERCENTILE_CONT(0.95) WITHIN GROUP (ORDER BY w) OVER (PARTITION BY queue, task_name),
       PERCENTILE_CONT(0.99) WITHIN GROUP (ORDER BY w) OVER (PARTITION BY queue, task_name),
       PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY r) OVER (PARTITION BY queue, task_name),
       PERCENTILE_CONT(0.95) WITHIN GROUP (ORDER BY r) OVER (PARTITION BY queue, task_name),
       PERCENTILE_CONT(0.99) WITHIN GROUP (ORDER BY r) OVER (PARTITION BY queue, task_name)
  FROM (SELECT queue, task_name,
               TIMESTAMPDIFF(MICROSECOND, enqueued_at, started_at) AS w,
               TIMESTAMPDIFF(MICROSECOND, started_at, finished_at) AS r
          FROM mysqlq_attempt
         WHERE finished_at >= UTC_TIMESTAMP() - INTERVAL 1 DAY
           AND outcome IN ('succeeded','retried','failed','lost')) AS a"""


def bench_report(conn: Any, work: Path, rows: int) -> dict[str, Any]:
    log("report: queuepipeline report (end to end) and the same questions in SQL")
    seconds, out = command(["report", "--output", str(work / "report")], work / "report.log")
    return {"rows": rows, "spark_seconds_end_to_end": seconds, "stdout": out.strip(),
            "sql_counts_seconds": timed_sql(conn, SQL_COUNTS),
            "sql_percentiles_seconds": timed_sql(conn, SQL_PERCENTILES)}


def bench_readers(rows: int) -> dict[str, Any]:
    """JDBC against the Python data source, in this process, one session."""
    log("readers: JDBC and the Python data source (mysqlclient), read + aggregate")
    from django_mysqlq.broker import pipeline as statements
    from django_mysqlq.contrib.spark import analytics, build_session, database, reading

    from .pyds import HistorySource

    started = time.perf_counter()
    spark = build_session("local[*]", {"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    session_seconds = time.perf_counter() - started
    db = database.database()
    low = int(scalar_django("SELECT MIN(id) FROM mysqlq_attempt"))
    high = int(scalar_django("SELECT MAX(id) FROM mysqlq_attempt"))
    read_plan = reading.plan(low, high)
    result: dict[str, Any] = {"session_seconds": session_seconds, "rows": rows,
                              "partitions": len(read_plan.slices()),
                              "max_connections": read_plan.max_connections}
    spark.dataSource.register(HistorySource)
    for attempt in range(2):
        for name in ("jdbc", "python_data_source"):
            started = time.perf_counter()
            if name == "jdbc":
                table = statements.HISTORY_SELECT.format(columns=statements.REPORT_COLUMNS,
                                                         where="1 = 1")
                frame = reading.read(spark, db, table, read_plan)
            else:
                frame = (spark.read.format("mysqlq_history")
                         .option("connect", json.dumps(db.connect_args))
                         .option("columns", statements.REPORT_COLUMNS)
                         .option("low", low).option("high", high)
                         .option("step", read_plan.partition_rows).load())
            analytics.aggregate(frame, 24.0).collect()
            result[f"{name}_seconds_{attempt + 1}"] = time.perf_counter() - started
    spark.stop()
    return result


def scalar_django(sql: str) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def worker_rate(conn: Any, seconds: float, until: Any = None) -> tuple[float, int]:
    """Noop attempts per second the running worker finishes over ``seconds`` (or until
    ``until()`` is true)."""
    first = scalar(conn, "SELECT COUNT(*) FROM mysqlq_attempt WHERE worker_id != 'bench-worker'")
    started = time.perf_counter()
    while time.perf_counter() - started < seconds if until is None else not until():
        time.sleep(0.2)
    done = scalar(conn, "SELECT COUNT(*) FROM mysqlq_attempt WHERE worker_id != 'bench-worker'")
    elapsed = time.perf_counter() - started
    return (done - first) / elapsed, done - first


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds a live process has used (None if unknown)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pid() -> int | None:
    """The local MariaDB server's pid, if this machine runs it (for its CPU time)."""
    for path in ("/run/mysqld/mysqld.pid", "/var/run/mysqld/mysqld.pid"):
        try:
            return int(Path(path).read_text().strip())
        except (OSError, ValueError):
            continue
    return None


class SessionCpu:
    """CPU seconds of every process of one session (a command and the JVM it starts,
    which outlives its parent's wait), sampled while it runs."""

    def __init__(self, session: int) -> None:
        self.session = session
        self.seen: dict[int, float] = {}

    def sample(self) -> None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == self.session:
                used = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
                self.seen[int(entry.name)] = max(used, self.seen.get(int(entry.name), 0.0))

    def total(self) -> float:
        return round(sum(self.seen.values()), 1)


def cpu_delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(after - before, 1)


def bench_archive(conn: Any, work: Path, rows: int, with_worker: bool = True) -> dict[str, Any]:
    from bench.perf.context import _FILL_SQL, NOOP_PAYLOAD, NOOP_TASK
    from bench.perf.workers import WorkerProcess, worker_args

    worker = None
    if with_worker:
        log(f"archive: a worker drains {WORKER_FILL} no-op messages; its rate alone, then "
            "beside queuepipeline archive")
        cursor = conn.cursor()
        for _ in range(WORKER_FILL // 100_000):
            cursor.execute(_FILL_SQL.format(n=100_000), ["default", NOOP_TASK, NOOP_PAYLOAD])
        env = {"MYSQLQ_BENCH_DB": os.environ["MYSQLQ_BENCH_DB"]}
        worker = WorkerProcess(worker_args(4, 1), work, "worker", env)
    else:
        log("archive: queuepipeline archive alone (--archive-alone: no worker beside it)")
    worker_pid = worker.pid if worker is not None else None
    try:
        if worker is not None:
            time.sleep(5.0)  # started, warmed up
        server = server_pid()
        cpu = {"server": cpu_seconds(server), "worker": cpu_seconds(worker_pid)}
        alone = worker_rate(conn, WORKER_WINDOW)[0] if worker is not None else None
        cpu_alone = {"server": cpu_seconds(server), "worker": cpu_seconds(worker_pid)}
        archive_log = work / "archive.log"
        env_all = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS,
                   "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        started = time.perf_counter()
        with archive_log.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "django", "queuepipeline", "archive", "--older-than",
                 "30m", "--to", str(work / "archive")], cwd=ROOT, env=env_all,
                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
            sampler = SessionCpu(process.pid)

            def ended() -> bool:
                sampler.sample()
                return process.poll() is not None

            during, processed = worker_rate(conn, 0, until=ended)
        seconds = time.perf_counter() - started
        cpu_during = {"server": cpu_seconds(server), "worker": cpu_seconds(worker_pid)}
        out = process.stdout.read().decode() if process.stdout else ""
        if process.returncode != 0:
            raise SystemExit(f"archive failed: {out}\n{archive_log.read_text()[-3000:]}")
    finally:
        if worker is not None:
            worker.kill()
    job = re.search(r"in ([\d.]+)s", out)
    left = scalar(conn, "SELECT COUNT(*) FROM mysqlq_attempt WHERE worker_id = 'bench-worker'")
    import pyarrow.dataset as ds

    archived = ds.dataset(str(work / "archive" / "history"), format="parquet",
                          partitioning="hive").count_rows()
    return {"rows": rows, "archived_rows": archived, "left_in_mysql": left,
            "seconds_end_to_end": seconds, "job_seconds": float(job[1]) if job else None,
            "rows_per_second_end_to_end": rows / seconds,
            "rows_per_second_job": rows / float(job[1]) if job else None,
            "worker_rate_alone": alone, "worker_rate_during_archive": during,
            "worker_processed_during_archive": processed,
            # CPU seconds: the archive command (Python driver, its JVM, Spark's Python
            # workers), the database server, the worker; per window (alone, during).
            "cpu_archive_command": sampler.total(),
            "cpu_server_worker_alone": cpu_delta(cpu["server"], cpu_alone["server"]),
            "cpu_worker_alone": cpu_delta(cpu["worker"], cpu_alone["worker"]),
            "cpu_server_during_archive": cpu_delta(cpu_alone["server"], cpu_during["server"]),
            "cpu_worker_during_archive": cpu_delta(cpu_alone["worker"], cpu_during["worker"]),
            "load_average_after": os.getloadavg(), "stdout": out.strip()}


def partition_history(conn: Any, rows: int, width: int) -> dict[str, Any]:
    """Seed the history again and partition it: the conversion's time and server CPU."""
    from django.core.management import call_command

    from bench.perf import db

    from .seed import seed

    db.truncate_queue(conn)
    call_command("queuehistory", "unpartition")  # an empty table: instant
    log(f"archive, partitioned: seeding {rows} history rows again, then partitioning them "
        f"by {width} ids (queuehistory partition)")
    seed(conn, rows, span_seconds=20 * 3600, end_seconds_ago=3600)
    server = server_pid()
    before = cpu_seconds(server)
    started = time.perf_counter()
    call_command("queuehistory", "partition", "--rows-per-partition", str(width))
    return {"rows_per_partition": width,
            "partition_seconds": round(time.perf_counter() - started, 1),
            "cpu_server_partition": cpu_delta(before, cpu_seconds(server))}


def bench_enqueue(conn: Any, work: Path, rows: int) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    log(f"enqueue: {rows} rows of Parquet through queuepipeline enqueue, then enqueue_many")
    cursor = conn.cursor()
    cursor.execute("TRUNCATE TABLE mysqlq_message")
    source = work / "input.parquet"
    now = time.time_ns()
    pq.write_table(pa.table({"enqueued_ns": pa.array([now] * rows, pa.int64()),
                             "seq": pa.array(range(rows), pa.int64())}), source)
    seconds, out = command(["enqueue", "--task", "bench.perf.benchapp.tasks.stamp", "--input",
                            str(source), "--args", "enqueued_ns,seq"], work / "enqueue.log")
    job = re.search(r"in ([\d.]+)s", out)
    made = scalar(conn, "SELECT COUNT(*) FROM mysqlq_message")
    cursor.execute("TRUNCATE TABLE mysqlq_message")
    from bench.perf.benchapp.tasks import stamp

    started = time.perf_counter()
    for first in range(0, rows, 10_000):
        stamp.enqueue_many([(now, seq) for seq in range(first, min(first + 10_000, rows))])
    plain = time.perf_counter() - started
    plain_made = scalar(conn, "SELECT COUNT(*) FROM mysqlq_message")
    cursor.execute("TRUNCATE TABLE mysqlq_message")
    return {"rows": rows, "messages": made, "seconds_end_to_end": seconds,
            "job_seconds": float(job[1]) if job else None,
            "messages_per_second_end_to_end": rows / seconds,
            "messages_per_second_job": rows / float(job[1]) if job else None,
            "enqueue_many_seconds": plain, "enqueue_many_messages": plain_made,
            "enqueue_many_per_second": rows / plain, "stdout": out.strip()}


def markdown(results: dict[str, Any]) -> str:
    def num(value: Any) -> str:
        return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}" if isinstance(
            value, int) else str(value)

    lines = [f"# bench.pipeline {results['run']}", "",
             f"{results['rows']:,} history rows; load average before/after "
             f"{results['load_before']} / {results['load_after']}; "
             f"{results['machine']}; Spark class archive: {results.get('class_archive')}", ""]
    for step in SECTIONS:
        if step in results:
            lines += [f"## {step}", "", "| figure | value |", "| --- | --- |"]
            lines += [f"| {key} | {num(value)} |" for key, value in results[step].items()
                      if key != "stdout"]
            lines.append("")
    return "\n".join(lines)


def class_archive_state() -> str:
    """Whether the jobs' JVMs map a class archive (docs/pipeline.md), or the first one
    writes it as it ends (its start is then the slow one), or there is none."""
    from django_mysqlq.contrib.spark.session import session_conf

    options = session_conf("local[*]")["spark.driver.extraJavaOptions"]
    if "SharedArchiveFile" in options:
        return "mapped"
    return "written by the first job" if "ArchiveClassesAtExit" in options else "off"


def warm_class_archive(conn: Any) -> None:
    """With no class archive yet, the first job's JVM writes one as it ends, which its
    time would include: a small archive run (the same classes: JDBC, Parquet, the
    verification) writes it first, so every measured job maps it."""
    if class_archive_state() != "written by the first job":
        return
    log("no Spark class archive yet: a 2,000-row archive run writes it first")
    from bench.perf import db

    from .seed import seed

    seed(conn, 2000, span_seconds=3600, end_seconds_ago=3600)
    with tempfile.TemporaryDirectory(prefix="mysqlq-pipeline-warm-") as tmp:
        command(["archive", "--older-than", "30m", "--to", str(Path(tmp) / "archive")],
                Path(tmp) / "archive.log")
    db.truncate_queue(conn)
    log(f"class archive: {class_archive_state()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", default=",".join(STEPS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--archive-alone", action="store_true",
                        help="archive with no worker draining a queue beside it")
    parser.add_argument("--partitioned", type=int, default=250_000, metavar="ROWS",
                        help="archive again on the history partitioned by ROWS ids per "
                             "partition, beside the plain run (0: don't)")
    parser.add_argument("--partitioned-only", action="store_true",
                        help="with --partitioned: skip the plain archive run")
    args = parser.parse_args(argv)
    steps = [step for step in STEPS if step in args.only.split(",")]
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ.setdefault("MYSQLQ_BENCH_DB", "mysqlq_pipeline_bench")
    import django

    django.setup()
    from django.core.management import call_command

    from bench.perf import db, environment

    from .seed import seed

    db.ensure_database()
    call_command("migrate", verbosity=0)
    conn = db.connect()
    db.truncate_queue(conn)
    call_command("queuehistory", "unpartition")  # a previous run's (empty: instant)
    run = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    warm_class_archive(conn)
    results: dict[str, Any] = {"run": run, "rows": args.rows,
                               "machine": environment.machine(),
                               "load_before": os.getloadavg(),
                               "class_archive": class_archive_state()}
    log(f"seeding {args.rows} history rows (finished 1 h to 21 h ago)")
    results["seed_seconds"] = seed(conn, args.rows, span_seconds=20 * 3600,
                                   end_seconds_ago=3600)
    with tempfile.TemporaryDirectory(prefix="mysqlq-pipeline-") as tmp:
        work = Path(tmp)
        for step in steps:
            if step == "report":
                results[step] = bench_report(conn, work, args.rows)
            elif step == "readers":
                results[step] = bench_readers(args.rows)
            elif step == "archive":
                if not (args.partitioned and args.partitioned_only):
                    results[step] = bench_archive(conn, work, args.rows,
                                                  not args.archive_alone)
                if args.partitioned:
                    layout = partition_history(conn, args.rows, args.partitioned)
                    (work / "partitioned").mkdir()
                    results["archive_partitioned"] = {**layout, **bench_archive(
                        conn, work / "partitioned", args.rows, not args.archive_alone)}
                    log(json.dumps({k: v for k, v in results["archive_partitioned"].items()
                                    if k != "stdout"}, default=str))
                    call_command("queuehistory", "unpartition")
            else:
                results[step] = bench_enqueue(conn, work, args.rows)
            if step in results:
                log(json.dumps({k: v for k, v in results[step].items() if k != "stdout"},
                               default=str))
    results["load_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"pipeline-{run}.json").write_text(json.dumps(results, indent=2, default=str))
    (args.out / f"pipeline-{run}.md").write_text(markdown(results))
    log(f"wrote {args.out}/pipeline-{run}.json and .md")


if __name__ == "__main__":
    main()
