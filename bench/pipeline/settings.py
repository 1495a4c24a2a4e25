"""The benchmark's Django settings: bench.perf's, on its own database
``mysqlq_pipeline_bench`` (``MYSQLQ_BENCH_DB`` overrides it), never the tests' ones."""

import os

os.environ.setdefault("MYSQLQ_BENCH_DB", "mysqlq_pipeline_bench")

from bench.perf.settings import *  # noqa: F403
