"""What a workload measures: named figures, one value per repeat, summarised by median."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (like numpy's default); ``inf`` values (never seen)
    sort last and make a percentile that reaches them ``inf``."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * pct / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    if rank == low or ordered[low] == ordered[high]:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclasses.dataclass
class Figure:
    """One measured quantity of one case, e.g. burn-down 4x2 batch 100: tasks/s."""

    workload: str
    case: str
    metric: str
    unit: str
    values: list[float] = dataclasses.field(default_factory=list)
    #: ``"raw/<case>/<metric>"`` of the plain-MySQLdb figure this one compares to.
    raw_ref: str | None = None
    #: Per-repeat details (timings of pre-fills, history list lengths, counters...).
    details: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.workload}/{self.case}/{self.metric}"

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    def add(self, value: float, **details: Any) -> None:
        self.values.append(float(value))
        if details:
            self.details.append(details)

    def as_dict(self, ratio: float | None) -> dict[str, Any]:
        return {
            "workload": self.workload, "case": self.case, "metric": self.metric,
            "unit": self.unit, "median": _finite(self.median),
            "min": _finite(min(self.values)) if self.values else None,
            "max": _finite(max(self.values)) if self.values else None,
            "values": [_finite(v) for v in self.values], "raw_ref": self.raw_ref,
            "ratio_to_raw": ratio, "details": self.details, "note": self.note,
        }


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


class Results:
    """All figures of a run, in the order they were first measured."""

    def __init__(self) -> None:
        self._figures: dict[str, Figure] = {}

    def figure(self, workload: str, case: str, metric: str, unit: str,
               raw_ref: str | None = None, note: str = "") -> Figure:
        key = f"{workload}/{case}/{metric}"
        if key not in self._figures:
            self._figures[key] = Figure(workload, case, metric, unit, raw_ref=raw_ref,
                                        note=note)
        return self._figures[key]

    def drop(self, workload: str) -> None:
        """Forget a workload's figures (it is being measured again)."""
        self._figures = {k: f for k, f in self._figures.items() if f.workload != workload}

    def __iter__(self) -> Any:
        return iter(self._figures.values())

    def ratio(self, fig: Figure) -> float | None:
        """This figure's median over its raw reference's median, from the same run."""
        if fig.raw_ref is None or fig.raw_ref not in self._figures:
            return None
        raw = self._figures[fig.raw_ref].median
        if not raw or not math.isfinite(raw) or not math.isfinite(fig.median):
            return None
        return round(fig.median / raw, 3)

    def as_list(self) -> list[dict[str, Any]]:
        return [fig.as_dict(self.ratio(fig)) for fig in self]
