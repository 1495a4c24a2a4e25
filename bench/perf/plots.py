"""PNG plots next to the table (matplotlib, from the ``bench`` extra; skipped without it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw(run: dict[str, Any], out_dir: Path) -> list[str]:
    """Draw what the run measured; return the file names written (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    stem = f"perf-{run['run_id']}"
    results = run["results"]
    burn = [r for r in results if r["workload"] == "burndown" and r["median"] is not None]
    if burn:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(burn)), 4))
        labels = [r["case"] for r in burn]
        ax.bar(labels, [r["median"] for r in burn],
               yerr=[[r["median"] - r["min"] for r in burn],
                     [r["max"] - r["median"] for r in burn]],
               color=["tab:blue" if " b10 " in f"{r['case']} " else "tab:orange"
                      for r in burn],
               capsize=3)
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color="tab:blue", label="claim batch 10"),
                           Patch(color="tab:orange", label="claim batch 100")])
        ax.set_ylabel("tasks/s (median, min-max)")
        ax.set_title("Burn-down throughput by worker shape (threads x processes, batch)")
        ax.tick_params(axis="x", rotation=60)
        fig.tight_layout()
        name = f"{stem}-burndown.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    latency = [r for r in results if r["workload"] == "latency" and r["median"] is not None]
    if latency:
        cases = list(dict.fromkeys(r["case"] for r in latency))
        metrics = list(dict.fromkeys(r["metric"] for r in latency))
        fig, ax = plt.subplots(figsize=(6, 4))
        width = 0.8 / len(metrics)
        for i, metric in enumerate(metrics):
            values = [next((r["median"] for r in latency
                            if r["case"] == c and r["metric"] == metric), 0) for c in cases]
            ax.bar([x + i * width for x in range(len(cases))], values, width, label=metric)
        ax.set_xticks([x + width * (len(metrics) - 1) / 2 for x in range(len(cases))], cases)
        ax.set_ylabel("pickup latency, ms (median of repeats)")
        ax.set_title("Pickup latency by producer rate")
        ax.legend()
        fig.tight_layout()
        name = f"{stem}-latency.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written
