"""The data pipeline on Spark: ``report``, ``archive``, ``enqueue`` and ``replay``.

Install the extra (``pip install "django-mysqlq[spark]"``) and Java 17+. Each job is a
function taking a :class:`pyspark.sql.SparkSession`, so a notebook or a
``spark-submit`` script runs it on its own session::

    from django_mysqlq.contrib import spark as pipeline

    session = pipeline.build_session(master="local[*]")
    result = pipeline.report(session, output="/tmp/report")

``manage.py queuepipeline <job>`` does the same from the command line. Importing this
package does not import pyspark: the jobs load on first use, so the command can say
what to install when it is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

#: What to do when pyspark is missing.
INSTALL_HINT = (
    'The data pipeline needs PySpark: pip install "django-mysqlq[spark]" (PySpark 4, '
    "pyarrow, pandas, matplotlib), and Java 17 or later on the PATH (on Debian: "
    "apt-get install openjdk-17-jre-headless libmariadb-java)."
)

#: Public name -> module of this package that defines it.
_API = {
    "build_session": "session",
    "Database": "database",
    "PipelineError": "errors",
    "report": "analytics",
    "ReportResult": "analytics",
    "archive": "archiving",
    "ArchiveResult": "archiving",
    "enqueue": "fanout",
    "EnqueueResult": "fanout",
    "replay": "replaying",
    "ReplayResult": "replaying",
}

__all__ = ["INSTALL_HINT", "available", *_API]


def available() -> bool:
    """Whether pyspark can be imported here."""
    return importlib.util.find_spec("pyspark") is not None


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
