"""PNG plots next to the table (matplotlib, from the ``bench`` extra; skipped without it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PERCENTILES = ("p50", "p95", "p99")


def draw(run: dict[str, Any], out_dir: Path) -> list[str]:
    """Draw what the run measured; return the file names written (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    stem = f"perf-{run['run_id']}"
    written = []
    for suffix, drawer in (("burndown", _burndown), ("latency", _latency)):
        fig = drawer(plt, run["results"])
        if fig is None:
            continue
        fig.tight_layout()
        name = f"{stem}-{suffix}.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def _burndown(plt: Any, results: list[dict[str, Any]]) -> Any:
    """Bars of tasks/s per case (threads x processes, batch, size), coloured by batch."""
    burn = [r for r in results if r["workload"] == "burndown" and r["median"] is not None]
    if not burn:
        return None
    from matplotlib.patches import Patch

    batches = sorted({r["case"].split()[1] for r in burn}, key=lambda b: int(b[1:]))
    colours = {b: f"C{i}" for i, b in enumerate(batches)}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(burn) + 2), 4.5))
    ax.bar([r["case"] for r in burn], [r["median"] for r in burn],
           yerr=[[r["median"] - r["min"] for r in burn], [r["max"] - r["median"] for r in burn]],
           color=[colours[r["case"].split()[1]] for r in burn], capsize=3)
    ax.legend(handles=[Patch(color=colours[b], label=f"claim batch {b[1:]}") for b in batches])
    ax.set_ylabel("tasks/s (median; bars: min-max)")
    ax.set_title("Burn-down throughput by worker shape\n(threads x processes, batch, tasks)")
    ax.tick_params(axis="x", rotation=60)
    return fig


def _latency(plt: Any, results: list[dict[str, Any]]) -> Any:
    """Grouped bars of p50/p95/p99 per rate and mode, log scale (poll is far slower)."""
    latency = [r for r in results if r["workload"] == "latency" and r["metric"] in PERCENTILES
               and r["median"] is not None]
    if not latency:
        return None
    cases = list(dict.fromkeys(r["case"] for r in latency))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(cases) + 2), 4.5))
    width = 0.8 / len(PERCENTILES)
    for i, metric in enumerate(PERCENTILES):
        values = [next((r["median"] for r in latency if r["case"] == case
                        and r["metric"] == metric), 0.0) for case in cases]
        ax.bar([x + i * width for x in range(len(cases))], values, width, label=metric)
    ax.set_xticks([x + width * (len(PERCENTILES) - 1) / 2 for x in range(len(cases))], cases)
    ax.set_yscale("log")
    ax.set_ylabel("pickup latency, ms (median of repeats, log)")
    ax.set_title("Pickup latency (enqueue commit to task start)")
    ax.legend()
    return fig
