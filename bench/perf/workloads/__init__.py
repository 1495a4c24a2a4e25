"""One module per workload; each exposes ``run(ctx)`` and records figures in ``ctx.results``."""
