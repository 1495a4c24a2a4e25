"""Django settings for the benchmark harness and the worker subprocesses it starts.

The database is ``mysqlq_bench`` (``MYSQLQ_BENCH_DB`` overrides it), never the one the
tests or the chaos run use. The queue settings are the library's defaults except where
noted, so the figures describe what a user gets out of the box.
"""

import os

SECRET_KEY = "bench-only"
USE_TZ = True
DEBUG = False
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_mysqlq",
    "bench.perf.benchapp",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.mysql",
        "HOST": os.environ.get("MYSQLQ_BENCH_HOST", "127.0.0.1"),
        "PORT": int(os.environ.get("MYSQLQ_BENCH_PORT", "3306")),
        "USER": os.environ.get("MYSQLQ_BENCH_USER", "root"),
        "PASSWORD": os.environ.get("MYSQLQ_BENCH_PASSWORD", ""),
        "NAME": os.environ.get("MYSQLQ_BENCH_DB", "mysqlq_bench"),
        # A restarted server must fail a run quickly, never hang it.
        "OPTIONS": {"charset": "utf8mb4", "connect_timeout": 5, "read_timeout": 600},
    }
}
MYSQLQ = {
    # Keep stdout/stderr of the workers quiet: no periodic summary lines.
    "SUMMARY_SECONDS": 0,
    # "0": idle workers poll instead of parking for wake-ups (the harness compares both).
    "WAKEUP": os.environ.get("MYSQLQ_BENCH_WAKEUP", "1") == "1",
    # "0" behind the idle workload's counting relay: a 1:1 TCP relay keeps each client's
    # own connection id (so KILL QUERY wake-ups are sound), but the server sees the
    # relay's address, which the proxy check would take for a pooler (and poll).
    "DETECT_PROXY": os.environ.get("MYSQLQ_BENCH_DETECT_PROXY", "1") == "1",
}
if os.environ.get("MYSQLQ_BENCH_ACK_BATCH"):
    # The tuned burn-down cases raise the ack batch (the crash re-run bound) above 20.
    MYSQLQ["ACK_BATCH_SIZE"] = int(os.environ["MYSQLQ_BENCH_ACK_BATCH"])
if os.environ.get("MYSQLQ_BENCH_STREAMS") == "1":
    # Workers of the streams workload: members of its consumer groups.
    MYSQLQ["TASK_MODULES"] = ["bench.perf.benchapp.streams"]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_mysqlq": {"handlers": ["stderr"], "level": "WARNING"}},
}
