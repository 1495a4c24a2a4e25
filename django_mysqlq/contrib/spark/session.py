"""A SparkSession set up for the pipeline: the JDBC jar, UTC, and this Python on executors."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from ...conf import get_settings
from . import classarchive, java
from .errors import PipelineError

APP_NAME = "django-mysqlq pipeline"

#: Defaults for every session this module builds; ``conf`` given by the caller wins.
#: Times are UTC everywhere (days of the archive's partitions, the report's buckets);
#: Parquet gets standard microsecond timestamps, not Spark's legacy INT96.
DEFAULT_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
}
#: Shuffle partitions on one machine: the reports' groups are small (queues by tasks).
LOCAL_SHUFFLE_PARTITIONS = "8"
#: The driver JVM on one machine (it runs the executors too) compiles with C1 only: a
#: job lasts seconds to minutes, and C2's compiler threads cost more CPU than its faster
#: code saves (measured on the archive of 1M rows on 2 cores: JVM start 9-10 -> 4.7 CPU
#: seconds, JDBC read + Parquet write 24-27 -> 20 CPU seconds; docs/performance.md).
LOCAL_DRIVER_JAVA_OPTIONS = "-Duser.timezone=UTC -XX:TieredStopAtLevel=1"


def parse_conf(items: list[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` from repeated ``--conf`` options, checked."""
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PipelineError(f"--conf {item!r}: expected KEY=VALUE, e.g. "
                                "--conf spark.executor.memory=4g.")
        conf[key.strip()] = value
    return conf


def session_conf(master: str, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """Everything :func:`build_session` sets, before the caller's ``conf`` is applied."""
    return _session_plan(master, conf)[0]


def _session_plan(master: str, conf: Mapping[str, str] | None
                  ) -> tuple[dict[str, str], classarchive.ClassArchive | None]:
    """The session's conf, and the class archive its local driver JVM maps or writes."""
    settings = get_settings()
    merged = dict(DEFAULT_CONF)
    if master.startswith("local"):
        merged["spark.sql.shuffle.partitions"] = LOCAL_SHUFFLE_PARTITIONS
        merged["spark.driver.extraJavaOptions"] = LOCAL_DRIVER_JAVA_OPTIONS
    if settings.SPARK_JDBC_JAR:
        merged["spark.jars"] = settings.SPARK_JDBC_JAR
    merged.update(conf or {})
    jar = settings.SPARK_JDBC_JAR
    if (jar and master.startswith("local") and "://" not in jar
            and merged.get("spark.jars") == jar and not os.path.exists(jar)):
        raise PipelineError(
            f"The JDBC driver jar {jar} (MYSQLQ['SPARK_JDBC_JAR']) does not exist. On "
            "Debian: apt-get install libmariadb-java; elsewhere set SPARK_JDBC_JAR to "
            "the MariaDB Connector/J jar, or pass --conf spark.jars.packages="
            "org.mariadb.jdbc:mariadb-java-client:3.5.1 with Maven reachable.")
    archive = None
    if master.startswith("local") and merged["spark.driver.extraJavaOptions"] == \
            LOCAL_DRIVER_JAVA_OPTIONS:  # not when the caller gave the JVM its options
        archive = _class_archive(settings.SPARK_CLASS_ARCHIVE, merged.get("spark.jars", ""))
        if archive is not None:
            merged["spark.driver.extraJavaOptions"] += " " + archive.java_options
    return merged, archive


def _class_archive(setting: str, jars: str) -> classarchive.ClassArchive | None:
    try:
        return classarchive.plan(setting, java.find(), jars)
    except PipelineError:
        return None  # no Java: build_session's check says what to install


def build_session(master: str = "local[*]", conf: Mapping[str, str] | None = None,
                  app_name: str = APP_NAME) -> SparkSession:
    """A session on ``master`` with the pipeline's settings (and ``conf`` on top).

    An active session is reused as it is (a notebook's, a test's): only the SQL
    settings the pipeline needs are set on it.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        prepare(active)
        return active
    if master.startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        # Executors run this interpreter (a different python3 on the PATH is refused by
        # PySpark as a version mismatch) unless PYSPARK_PYTHON says otherwise.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    launching = not _gateway_running()
    if launching:
        java.check()  # before PySpark tries to start a JVM, to say what is missing
    merged, archive = _session_plan(master, conf)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in merged.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if launching and archive is not None:
        from pyspark import SparkContext

        classarchive.finish_at_exit(archive, getattr(SparkContext, "_gateway", None))
    prepare(session)
    return session


def _gateway_running() -> bool:
    """Whether this process already has a JVM gateway (a stopped session's), or is told to
    use one (``PYSPARK_GATEWAY_PORT``, as under ``spark-submit``): no Java to start then."""
    from pyspark import SparkContext

    return bool(os.environ.get("PYSPARK_GATEWAY_PORT")) or \
        getattr(SparkContext, "_gateway", None) is not None


def prepare(session: SparkSession) -> None:
    """The SQL settings every job relies on, on any session (also one built elsewhere)."""
    session.conf.set("spark.sql.session.timeZone", "UTC")
    session.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    # The archive writes by day and queue: keep a writer open per partition directory
    # instead of sorting each task's rows by them first.
    session.conf.set("spark.sql.maxConcurrentOutputFileWriters", "64")
