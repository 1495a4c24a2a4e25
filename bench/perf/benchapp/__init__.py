"""Tasks the benchmark enqueues: a no-op and a pickup-latency stamp."""
