"""One Spark session (local mode, real JVM) shared by every pipeline test.

Skipped where pyspark isn't installed (CI installs the ``spark`` extra into ``.venv``
only, not into ``.venv-django52``): ``test_pipeline_imports.py`` runs everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from django_mysqlq.contrib.spark import build_session

    # local[2,3]: 2 threads, and a failed task is tried up to 3 times (the retry test).
    session = build_session("local[2,3]", {
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
