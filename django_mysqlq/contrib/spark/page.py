"""``report.html``: one self-contained page (charts as embedded PNGs, no external files)."""

from __future__ import annotations

import base64
import io
from collections import defaultdict
from html import escape
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUTCOME_COLOURS = {"succeeded": "#2e7d32", "retried": "#f9a825", "failed": "#c62828",
                   "lost": "#6a1b9a", "cancelled": "#757575"}
STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1100px;
color:#222;padding:0 1rem}h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.15rem;
margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.3rem}.meta{color:#666}
.cards{display:flex;gap:.8rem;flex-wrap:wrap;margin:1rem 0}.card{background:#f5f5f5;
border-radius:6px;padding:.6rem 1rem;min-width:7rem}.card b{display:block;font-size:1.3rem}
table{border-collapse:collapse;width:100%;font-size:.85rem}th,td{padding:.3rem .5rem;
border-bottom:1px solid #eee;text-align:right}th:first-child,td:first-child,
th:nth-child(2),td:nth-child(2){text-align:left}img{max-width:100%}.grid{display:grid;
grid-template-columns:1fr 1fr;gap:1rem}.wide{overflow-x:auto}
@media(max-width:800px){.grid{grid-template-columns:1fr}}
"""


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _image(title: str, png: str | None) -> str:
    if png is None:
        return f"<figure><figcaption>{escape(title)}</figcaption><p>No data.</p></figure>"
    return (f'<figure><img alt="{escape(title)}" src="data:image/png;base64,{png}">'
            "</figure>")


def _label(task: dict[str, Any]) -> str:
    return f"{task['queue']}/{task['task_name'].rsplit('.', 1)[-1]}"


def throughput_chart(series: list[dict[str, Any]], unit: str) -> str | None:
    per_bucket: dict[str, dict[Any, int]] = defaultdict(lambda: defaultdict(int))
    for row in series:
        per_bucket[row["outcome"]][row["bucket"]] += row["count"]
    buckets = sorted({row["bucket"] for row in series})
    if not buckets:
        return None
    figure, axes = plt.subplots(figsize=(10, 3.2))
    bottom = [0] * len(buckets)
    positions = range(len(buckets))
    for outcome, colour in OUTCOME_COLOURS.items():
        values = [per_bucket[outcome].get(bucket, 0) for bucket in buckets]
        if any(values):
            axes.bar(positions, values, bottom=bottom, color=colour, label=outcome, width=1.0)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    step = max(1, len(buckets) // 6)
    axes.set_xticks(list(positions)[::step],
                    [str(bucket)[5:16].replace("T", " ") for bucket in buckets][::step],
                    rotation=20, fontsize=8)
    axes.set_title(f"Throughput: attempts per {unit} by outcome", pad=24)
    axes.legend(loc="lower left", bbox_to_anchor=(0, 1.0), fontsize=8, ncols=5,
                frameon=False)
    axes.spines[["top", "right"]].set_visible(False)
    return _png(figure)


def latency_chart(tasks: list[dict[str, Any]], kind: str) -> str | None:
    rows = [task for task in tasks if task[f"{kind}_ms_p50"] is not None][:15]
    if not rows:
        return None
    figure, axes = plt.subplots(figsize=(5.2, 0.45 * len(rows) + 1.2))
    labels = [_label(task) for task in rows]
    for offset, (suffix, colour) in enumerate((("p50", "#90caf9"), ("p95", "#1e88e5"),
                                               ("p99", "#0d47a1"))):
        axes.barh([i + (offset - 1) * 0.27 for i in range(len(rows))],
                  [max(task[f"{kind}_ms_{suffix}"], 0.001) for task in rows], height=0.27,
                  color=colour, label=suffix)
    axes.set_yticks(range(len(rows)), labels, fontsize=8)
    axes.set_xscale("log")
    axes.set_xlabel("milliseconds (log scale)")
    axes.set_title(f"{kind.capitalize()} time per task")
    axes.legend(fontsize=8)
    axes.invert_yaxis()
    return _png(figure)


def failure_chart(tasks: list[dict[str, Any]]) -> str | None:
    rows = [task for task in tasks if task["failure_rate"] is not None][:15]
    if not rows:
        return None
    figure, axes = plt.subplots(figsize=(5.2, 0.35 * len(rows) + 1.2))
    rates = [task["failure_rate"] * 100 for task in rows]
    axes.barh(range(len(rows)), rates,
              color=["#c62828" if rate >= 5 else "#ef9a9a" for rate in rates])
    axes.set_yticks(range(len(rows)), [_label(task) for task in rows], fontsize=8)
    axes.set_xlabel("% of attempts failed (retried, failed or lost)")
    axes.set_title("Failure rate per task")
    axes.invert_yaxis()
    return _png(figure)


def errors_chart(errors: list[dict[str, Any]]) -> str | None:
    rows = errors[:10]
    if not rows:
        return None
    figure, axes = plt.subplots(figsize=(5.2, 0.35 * len(rows) + 1.2))
    axes.barh(range(len(rows)), [row["first_half"] for row in rows], color="#ffab91",
              label="first half")
    axes.barh(range(len(rows)), [row["second_half"] for row in rows],
              left=[row["first_half"] for row in rows], color="#d84315", label="second half")
    axes.set_yticks(range(len(rows)),
                    [f"{row['error_class']} ({row['task_name'].rsplit('.', 1)[-1]})"
                     for row in rows], fontsize=8)
    axes.set_title("Top errors (split by half of the window)")
    axes.legend(fontsize=8, loc="lower right")
    axes.invert_yaxis()
    return _png(figure)


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return f"{value:,}" if isinstance(value, int) else escape(str(value))


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{escape(column)}</th>" for column in columns)
    body = "".join("<tr>" + "".join(f"<td>{_number(row.get(column))}</td>"
                                    for column in columns) + "</tr>" for row in rows)
    return (f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}'
            "</tbody></table></div>")


def render_page(summary: dict[str, Any], tables: dict[str, list[dict[str, Any]]]) -> str:
    totals = summary["totals"]
    window = summary["window"]
    tasks = summary["by_task"]
    rate = totals.get("success_rate")
    cards = "".join(
        f'<div class="card">{escape(label)}<b>{value}</b></div>' for label, value in (
            ("attempts", f"{totals['attempts']:,}"), ("messages", f"{totals['messages']:,}"),
            ("succeeded", f"{totals['succeeded']:,}"), ("retried", f"{totals['retried']:,}"),
            ("failed", f"{totals['failed']:,}"), ("lost", f"{totals['lost']:,}"),
            ("cancelled", f"{totals['cancelled']:,}"),
            ("success rate", f"{rate:.2%}" if rate is not None else "-")))
    percentiles = summary["percentiles"]
    task_columns = ["queue", "task_name", "attempts", "messages", "succeeded", "retried",
                    "failed", "lost", "cancelled", "success_rate", "attempts_per_message",
                    "throughput_per_hour", "wait_ms_p50", "wait_ms_p95", "wait_ms_p99",
                    "run_ms_p50", "run_ms_p95", "run_ms_p99"]
    sources = summary["sources"]
    source = "live history" + (f" and the archive at {sources['archive']}"
                               if sources.get("archive") else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Queue report</title>
<style>{STYLE}</style></head><body>
<h1>Queue report</h1>
<p class="meta">{escape(window['since'])} &ndash; {escape(window['until'])} (UTC) &middot;
{escape(source)} &middot; percentiles: percentile_approx, accuracy {percentiles['accuracy']}
(rank error &le; {percentiles['relative_rank_error']:.2%} of the rows)</p>
<div class="cards">{cards}</div>
{_image("Throughput", throughput_chart(tables["timeseries"], summary["bucket"]))}
<div class="grid">
{_image("Wait time per task", latency_chart(tasks, "wait"))}
{_image("Run time per task", latency_chart(tasks, "run"))}
{_image("Failure rate per task", failure_chart(tasks))}
{_image("Top errors", errors_chart(summary["top_errors"]))}
</div>
<h2>Per queue and task</h2>
{_table(tasks, task_columns)}
<h2>Top errors</h2>
{_table(summary["top_errors"], ["queue", "task_name", "error_class", "count", "first_half",
                               "second_half", "example_message_id", "last_seen"])}
<h2>Slowest attempts</h2>
{_table(summary["slowest_attempts"], ["queue", "task_name", "message_id", "attempt",
                                      "outcome", "run_ms", "finished_at"])}
</body></html>
"""
