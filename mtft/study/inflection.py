"""The inflection point of catastrophic overtraining (Springer et al., 2025, Definition 4.2 and Section 3): over
pre-training budgets, the budget after which a fine-tuned model's measure gets worse.

For one learning rate and one seed, the values of a measure at the budgets tried form a curve. Its inflection point
is the best budget on it -- the smallest budget at which the measure is at its best (lowest for a loss, highest for
an accuracy) -- when some larger budget is worse by more than ``tolerance``: every larger budget is then no better,
and at least one worse. When the best value is at the largest budget (or no larger budget is worse by more than
``tolerance``), more pre-training has not hurt yet: "none within the budgets tried".

Uncertainty over seeds: the inflection point is found on every seed's own curve (each seed pairs the runs of one
fine-tuning seed across budgets), and reported as the per-seed list, its range, and how many seeds found none;
the point estimate is the inflection point of the seed-mean curve. The per-seed list is the whole uncertainty: with
three seeds a bootstrap would only resample those three values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional


@dataclass
class Inflection:
    """The inflection point of one measure at one setting of the other axes (e.g. one learning rate)."""

    measure: str
    group: dict[str, Any]  # the other axes' values, e.g. {"training.optimizer.lr": 0.001}
    budgets: list[float]  # the budgets tried, ascending
    mean_curve: list[Optional[float]]  # the seed mean at each budget (None: no finite value there)
    point: Optional[float]  # the inflection point of the seed-mean curve; None: none within the budgets tried
    per_seed: dict[int, Optional[float]] = field(default_factory=dict)  # seed -> its inflection point (None: none)
    low: Optional[float] = None  # the smallest and largest per-seed inflection point (seeds with none left out)
    high: Optional[float] = None
    seeds_none: int = 0  # seeds whose curve has no inflection point within the budgets tried
    seeds_incomplete: list[int] = field(default_factory=list)  # seeds missing a budget: no curve, not counted

    @property
    def agreement(self) -> str:
        """``all seeds agree``, ``seeds disagree`` or ``no seeds`` (every seed incomplete)."""
        found = list(self.per_seed.values())
        if not found:
            return "no seeds"
        return "all seeds agree" if len(set(found)) == 1 else "seeds disagree"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["per_seed"] = {str(seed): value for seed, value in self.per_seed.items()}
        data["agreement"] = self.agreement
        return data


def curve_inflection(
    budgets: list[float], values: list[float], lower_is_better: bool, tolerance: float = 0.0
) -> Optional[float]:
    """The inflection point of one curve (``budgets`` ascending, one finite value each), or None."""
    if len(budgets) != len(values) or not budgets:
        raise ValueError(f"{len(budgets)} budgets and {len(values)} values: one value per budget is needed")
    if list(budgets) != sorted(set(budgets)):
        raise ValueError(f"budgets must be distinct and ascending, got {budgets}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    sign = 1.0 if lower_is_better else -1.0
    scores = [sign * v for v in values]  # lower is better from here on
    best = min(range(len(scores)), key=lambda i: (scores[i], i))  # the smallest budget at the best value
    later = scores[best + 1 :]
    if not later or max(later) - scores[best] <= tolerance:
        return None
    return budgets[best]


def find_inflections(
    records: list[dict[str, Any]],
    budget_axis: str,
    measure: str,
    lower_is_better: bool,
    tolerance: float = 0.0,
) -> list[Inflection]:
    """Per setting of the axes other than ``budget_axis`` (e.g. per learning rate), the inflection point of
    ``measure`` (a key of the records' ``metrics``) over the budgets, per seed and on the seed-mean curve.

    ``records``: the study's run records (:func:`mtft.study.aggregate.run_record`); only complete runs with a
    finite value count. A seed lacking a budget has no curve and is listed as incomplete, not guessed."""
    groups: dict[tuple, dict[str, Any]] = {}
    values: dict[tuple, dict[int, dict[float, float]]] = {}
    for record in records:
        axes = record["axes"]
        if record["status"] != "complete" or budget_axis not in axes:
            continue
        value = record["metrics"].get(measure)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        group = {k: v for k, v in axes.items() if k != budget_axis}
        key = tuple(sorted((k, repr(v)) for k, v in group.items()))
        groups.setdefault(key, group)
        values.setdefault(key, {}).setdefault(record["seed"], {})[float(axes[budget_axis])] = float(value)
    budgets_tried = sorted({float(r["axes"][budget_axis]) for r in records if budget_axis in r["axes"]})
    results = []
    for key, group in groups.items():
        by_seed = values[key]
        result = Inflection(measure, group, budgets_tried, [], None)
        for seed in sorted(by_seed):
            curve = by_seed[seed]
            if set(curve) != set(budgets_tried):
                result.seeds_incomplete.append(seed)
                continue
            result.per_seed[seed] = curve_inflection(
                budgets_tried, [curve[b] for b in budgets_tried], lower_is_better, tolerance
            )
        found = [v for v in result.per_seed.values() if v is not None]
        result.seeds_none = sum(v is None for v in result.per_seed.values())
        result.low, result.high = (min(found), max(found)) if found else (None, None)
        means = []
        complete = [by_seed[seed] for seed in result.per_seed] or list(by_seed.values())
        for budget in budgets_tried:
            present = [curve[budget] for curve in complete if budget in curve]
            means.append(sum(present) / len(present) if present else None)
        result.mean_curve = means
        if all(m is not None for m in means):
            result.point = curve_inflection(budgets_tried, [float(m) for m in means], lower_is_better, tolerance)
        results.append(result)
    return results


def describe(result: Inflection) -> str:
    """The inflection point in words, with its uncertainty over seeds, for a table cell."""
    if not result.per_seed and result.point is None:
        return "no complete seed"
    point = "none within the budgets tried" if result.point is None else f"{result.point:,.0f}"
    seeds = ", ".join(
        f"{seed}: {'none' if value is None else f'{value:,.0f}'}" for seed, value in result.per_seed.items()
    )
    text = f"{point} (per seed {seeds}; {result.agreement})"
    if result.seeds_incomplete:
        text += f"; seeds {result.seeds_incomplete} lack a budget"
    return text
