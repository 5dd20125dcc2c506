"""Is a cell's spread over seeds different from its baseline cell's? The stability study's question (Fu, So &
Collier, 2023, Table 2 reports the standard deviation over 10 seeds), asked with a test instead of by eye.

``analyses: {spread: {}}`` in a study file with a ``baseline``: for every cell and metric, the ratio of the sample
standard deviations over seeds (cell ÷ its baseline partner, the partner the paired differences use) and the p-value
of the Brown–Forsythe test of equal spread (``scipy.stats.levene(center="median")``: robust to the skewed, bounded
metrics a failed run produces, where the F-test of variances is not). The runs need not be paired for it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import numpy as np
from scipy import stats

from mtft.core.atomic import write_json
from mtft.study.aggregate import StudyResults
from mtft.study.analysis import StudyAnalysis

TEST = "Brown–Forsythe (scipy.stats.levene, center='median')"
#: a spread below this (relative to the values' scale) is float round-off of equal values (a std of 1e-16 for
#: seeds that all scored 0.8167), counted as none
ROUND_OFF = 1e-9


def spread_comparison(cell: list[float], baseline: list[float]) -> dict[str, Optional[float]]:
    """Sample standard deviations, their ratio and the Brown–Forsythe p-value of two sets of finite values (None
    where it is undefined: fewer than 2 values, a zero baseline spread for the ratio, deviations from the medians
    that do not vary within either set for p)."""
    a, b = np.asarray(cell, dtype=float), np.asarray(baseline, dtype=float)
    if len(a) < 2 or len(b) < 2:
        return {"n": len(a), "n_baseline": len(b), "std": None, "std_baseline": None, "ratio": None, "p_value": None}
    tiny = ROUND_OFF * max(1.0, float(np.abs(np.concatenate([a, b])).max()))
    sa, sb = (float(x.std(ddof=1)) if float(x.std(ddof=1)) > tiny else 0.0 for x in (a, b))
    deviations = [np.abs(a - np.median(a)), np.abs(b - np.median(b))]
    # the test is an ANOVA of the deviations from the medians: without spread within them it is undefined (W = inf)
    varied = any(float(d.std()) > tiny for d in deviations)
    p = float(stats.levene(a, b, center="median").pvalue) if varied else None
    return {
        "n": len(a),
        "n_baseline": len(b),
        "std": sa,
        "std_baseline": sb,
        "ratio": sa / sb if sb > 0 else None,
        "p_value": p if p is None or math.isfinite(p) else None,
    }


def values_by_cell(records: list[dict[str, Any]], metric: str) -> dict[str, list[float]]:
    """The complete runs' finite values of ``metric``, per cell."""
    found: dict[str, list[float]] = defaultdict(list)
    for record in records:
        value = record["metrics"].get(metric)
        if record["status"] == "complete" and isinstance(value, (int, float)) and math.isfinite(value):
            found[record["cell"]].append(float(value))
    return found


class SpreadAnalysis(StudyAnalysis):
    name = "spread"

    def write(self, folder: Path, link: str, records: list[dict[str, Any]], results: StudyResults) -> list[str]:
        partners = sorted({(d.cell, d.baseline_cell) for d in results.differences})
        metrics = [m for m in results.metrics if m != "wall_s"]
        by_metric = {m: values_by_cell(records, m) for m in metrics}
        rows = [
            {"cell": cell, "baseline_cell": base, "metric": m, **spread_comparison(v.get(cell, []), v.get(base, []))}
            for cell, base in partners
            for m, v in by_metric.items()
        ]
        write_json(folder / "spread.json", {"test": TEST, "rows": rows})
        return section(rows, metrics, link)


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def section(rows: list[dict[str, Any]], metrics: list[str], link: str) -> list[str]:
    lines = [
        "## Spread over seeds against the baseline",
        "",
        "Per cell and metric: sample std over the seeds ÷ the baseline partner's, and in brackets the p-value of the "
        f"{TEST} test of equal spread (a ratio below 1 with a small p: more stable than the baseline). "
        f"Every row in [{link}/spread.json]({link}/spread.json).",
        "",
        "| cell | baseline cell | " + " | ".join(metrics) + " | metrics with a smaller std |",
        "|---|---|" + "---:|" * (len(metrics) + 1),
    ]
    by_pair: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        by_pair[row["cell"], row["baseline_cell"]][row["metric"]] = row
    for (cell, base), cells in by_pair.items():
        shown = [f"{_fmt(cells[m]['ratio'])} (p {_fmt(cells[m]['p_value'])})" for m in metrics]
        compared = [c for c in cells.values() if c["std"] is not None]
        smaller = sum(c["std"] < c["std_baseline"] for c in compared)
        lines.append(f"| {cell} | {base} | " + " | ".join(shown) + f" | {smaller}/{len(compared)} |")
    return lines + [""]
