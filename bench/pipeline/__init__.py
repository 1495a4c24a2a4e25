"""``python -m bench.pipeline``: the Spark pipeline measured beside the same work without
Spark (see docs/performance.md)."""
