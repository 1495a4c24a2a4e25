"""Django settings of the chaos run: the harness and the workers it starts.

The database is ``mysqlq_chaos`` (``MYSQLQ_CHAOS_DB`` overrides it), never the one the
tests or the benchmark use. The queue is tuned to notice failures fast, so a run of a
minute sees every kind of recovery several times.
"""

import os

SECRET_KEY = "chaos-only"
USE_TZ = True
DEBUG = False
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_mysqlq",
    "bench.chaos.ledger",
]
_DATABASE = {
    "ENGINE": "django.db.backends.mysql",
    "HOST": os.environ.get("MYSQLQ_CHAOS_HOST", "127.0.0.1"),
    "PORT": int(os.environ.get("MYSQLQ_CHAOS_PORT", "3306")),
    "USER": os.environ.get("MYSQLQ_CHAOS_USER", "root"),
    "PASSWORD": os.environ.get("MYSQLQ_CHAOS_PASSWORD", ""),
    "NAME": os.environ.get("MYSQLQ_CHAOS_DB", "mysqlq_chaos"),
    # A server that went away must fail a statement quickly, never hang it.
    "OPTIONS": {"charset": "utf8mb4", "connect_timeout": 5, "read_timeout": 60,
                "write_timeout": 60},
}
DATABASES = {
    "default": _DATABASE,
    # The same database on a second connection per thread: ledger rows written there
    # stay even when the atomic task that wrote them rolls back.
    "ledger": dict(_DATABASE),
}
MYSQLQ = {
    "HEARTBEAT_SECONDS": 1.0,
    # On a Galera cluster (--galera) claims are judged by lease alone: a shorter one there.
    "LEASE_SECONDS": float(os.environ.get("MYSQLQ_CHAOS_LEASE", "5")),
    "RECOVERY_SECONDS": 0.5,
    "POLL_SECONDS": 0.2,
    "GRACE_SECONDS": 10.0,
    # Chaos spends attempts (every lost claim counts one): leave room, so a message
    # never dies of chaos alone and "dead" stays a signal.
    "MAX_ATTEMPTS": 25,
    "RETRY_BACKOFF": 0.2,
    "RETRY_BACKOFF_MAX": 2.0,
    "SUMMARY_SECONDS": 0,
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(process)d %(threadName)s %(levelname)s "
                            "%(name)s: %(message)s"},
    },
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_mysqlq": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "bench.chaos": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
    },
}
