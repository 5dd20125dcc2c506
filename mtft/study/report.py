"""A study's results on disk, each file replaced in one rename: ``results.json`` (everything),
``results.csv`` (one row per cell and metric, with the paired difference when there is a baseline), ``study.md``
(the tables a reader wants, failed runs with their error line, the plots) and ``plots/``."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Optional, Sequence

from mtft.core.atomic import AtomicFolder, write_json, write_text
from mtft.core.errors import shorten
from mtft.study import plots
from mtft.study.aggregate import MetricStats, StudyResults, family, is_per_objective, objective
from mtft.study.plots import Figure

STATS = ("n", "nan", "missing", "mean", "std", "min", "max")
DIFFERENCE = ("baseline_cell", "n_pairs", "diff_mean", "diff_std", "ci_low", "ci_high", "p_value")
#: with a ``failure`` list: the runs at or below the majority-class baseline, of those scored against it
FAILURE = ("at_or_below_majority", "scored_against_majority", "majority_baseline")


def write_results(
    study_dir: Path,
    results: StudyResults,
    name: Optional[str] = None,
    command: Optional[str] = None,
    sections: Sequence[str] = (),
) -> dict[str, Path]:
    """Write the study's results under ``study_dir`` (``name`` defaults to the folder's; ``command`` is the command
    line that ran the study, shown in study.md; ``sections``: the study analyses' lines, before the plots); returns
    the files written by kind."""
    study_dir = Path(study_dir)
    with AtomicFolder(study_dir / "plots").writing(kind="study plots") as folder:
        figures, left_out = plots.plot_study(results, folder)
    paths = {kind: study_dir / file for kind, file in (("json", "results.json"), ("csv", "results.csv"))}
    paths["md"] = study_dir / "study.md"
    write_json(paths["json"], results.to_json())
    write_text(paths["csv"], results_csv(results))
    write_text(paths["md"], study_markdown(results, name or study_dir.name, command, figures, left_out, sections))
    return paths


def results_csv(results: StudyResults) -> str:
    """One row per cell × metric: the cell, its axis values, the metric's statistics, the cell's failed/pending
    counts, and with a baseline the paired difference (empty for baseline cells)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header = ["cell", *results.axes, "metric", *STATS, "complete", "failed", "pending"]
    writer.writerow(
        header + (list(DIFFERENCE) if results.baseline else []) + (list(FAILURE) if results.failure else [])
    )
    for cell in results.cells:
        for metric in results.metrics:
            stats = cell.metrics[metric]
            row = [cell.name, *(cell.axes.get(axis, "") for axis in results.axes), metric]
            row += [_csv(getattr(stats, key)) for key in STATS]
            row += [cell.complete, len(cell.failed), len(cell.pending)]
            if results.baseline:
                d = results.difference(cell.name, metric)
                values = (d.baseline_cell, d.n_pairs, d.mean, d.std, d.ci_low, d.ci_high, d.p_value) if d else ()
                row += [_csv(v) for v in values] or [""] * len(DIFFERENCE)
            if results.failure:
                rate = cell.failures.get(metric)
                row += [rate.failed, rate.scored, _csv(rate.baseline_mean)] if rate else [""] * len(FAILURE)
            writer.writerow(row)
    return out.getvalue()


def study_markdown(
    results: StudyResults,
    name: str,
    command: Optional[str],
    figures: list[Figure],
    left_out: int,
    sections: Sequence[str] = (),
) -> str:
    cells = results.cells
    failed, pending = sum(len(c.failed) for c in cells), sum(len(c.pending) for c in cells)
    total = sum(c.complete for c in cells) + failed + pending
    lines = [f"# Study: {name}", "", f"Command: `{command or '(not recorded)'}`", ""]
    lines += [
        f"{total} runs: {total - failed - pending} complete, {failed} failed, {pending} pending (not run, or "
        "interrupted before the end).",
        "",
        "## Cells",
        "",
        "| cell | " + "".join(f"{_md(a)} | " for a in results.axes) + "complete | failed | pending |",
        "|---|" + "---|" * len(results.axes) + "---:|---:|---:|",
    ]
    for c in cells:
        axes = "".join(f"{_md(c.axes.get(a, '–'))} | " for a in results.axes)
        lines.append(f"| {_md(c.name)} | {axes}{c.complete} | {len(c.failed)} | {len(c.pending)} |")
    lines += ["", *_code_section(results), *_results_section(results), *_failure_section(results)]
    lines += _differences_section(results)
    if failed:
        lines += ["## Failed runs", ""]
        lines += [f"- `{f.run_dir}`: {shorten(f.error)}" for c in cells for f in c.failed] + [""]
    lines += [*sections, *_plots_section(figures, left_out)]
    return "\n".join(lines)


def _code_section(results: StudyResults) -> list[str]:
    """Say so when the complete runs were not all produced by the same mtft source (a study resumed across an
    edit or a commit): their numbers may not be comparable, and nothing else in the tables would show it. A run
    that recorded no source (finished before the record was kept) is counted apart, not as another version."""
    versions = dict(results.code_versions)
    unrecorded = versions.pop("unrecorded", 0)
    if not versions:
        return []  # nothing recorded (runs older than the record): nothing to say
    missing = f" ({unrecorded} run(s) recorded no source)" if unrecorded else ""
    if len(versions) == 1:
        runs = "every run that recorded one" if unrecorded else "every run"
        return [f"Code: {runs} by mtft source {next(iter(versions))}{missing}.", ""]
    listed = ", ".join(f"{source}: {count} runs" for source, count in versions.items())
    return [
        f"**Code: the complete runs come from {len(versions)} versions of the mtft source** ({listed}; a run "
        f"resumed across versions counts under each){missing}. Compare them only if the changes in between do not "
        "touch training; a fresh output_dir reruns everything under one version.",
        "",
    ]


def _results_section(results: StudyResults) -> list[str]:
    lines = [
        "## Results",
        "",
        "Mean ± sample standard deviation over the seeds (number of runs averaged); `nan`: runs whose value was "
        "NaN or infinite (diverged), left out of the mean; `missing`: complete runs without the metric.",
        "",
    ]
    if results.unmatched:
        lines += ["No run has a metric matching: " + ", ".join(f"`{p}`" for p in results.unmatched) + ".", ""]
    groups: dict[str, list[str]] = {}
    for metric in results.metrics:
        group = family(metric) if is_per_objective(metric) else metric.split("/")[0] if "/" in metric else ""
        groups.setdefault(group, []).append(metric)
    for group, metrics in groups.items():
        per_objective = is_per_objective(metrics[0])
        columns = [objective(m) for m in metrics] if per_objective else metrics
        title = f"{group} (per objective)" if per_objective else group or "run summaries"
        lines += [f"### {title}", "", "| cell | " + " | ".join(map(_md, columns)) + " |"]
        lines.append("|---|" + "---:|" * len(columns))
        for c in results.cells:
            lines.append(f"| {_md(c.name)} | " + " | ".join(_entry(c.metrics[m]) for m in metrics) + " |")
        lines.append("")
    return lines


def _failure_section(results: StudyResults) -> list[str]:
    """Per cell and ``failure`` metric: mean ± std, range and the failed-run rate (runs at or below the
    majority-class baseline; Mosbach et al., 2021) -- the stability numbers of Fu, So & Collier (2023) side by side."""
    if not (results.failure or results.failure_unmatched or results.failure_without_baseline):
        return []
    lines = [
        "## Stability over seeds: failed fine-tuning runs",
        "",
        "A run *fails* when its metric ends at or below the majority-class baseline it reports (`<task>/majority_"
        "<metric>`: the constant prediction of the majority class of its training labels, scored the same way; "
        "Mosbach et al., 2021). Failed runs: at or below / complete runs with both values (their seeds). Mean ± "
        "sample standard deviation and range (min–max) over the same cell's complete runs.",
        "",
    ]
    if results.failure:
        lines += [
            "| cell | metric | mean ± std | range | majority baseline | failed runs | seeds |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        for c in results.cells:
            for metric in results.failure:
                stats, rate = c.metrics[metric], c.failures[metric]
                value = (
                    "–"
                    if stats.mean is None
                    else _num(stats.mean) + ("" if stats.std is None else f" ± {_num(stats.std)}")
                )
                span = "–" if stats.min is None else f"{_num(stats.min)}–{_num(stats.max)}"
                share = f"{rate.failed}/{rate.scored}" + ("" if rate.rate is None else f" ({rate.rate:.0%})")
                seeds = ", ".join(map(str, rate.failed_seeds)) or "–"
                lines.append(
                    f"| {_md(c.name)} | {_md(metric)} | {value} | {span} | {_num(rate.baseline_mean)} | {share} | "
                    f"{seeds} |"
                )
        lines.append("")
    if results.failure_unmatched:
        lines += ["No run has a metric matching: " + ", ".join(f"`{p}`" for p in results.failure_unmatched) + ".", ""]
    if results.failure_without_baseline:
        lines += [
            "No majority-class baseline (no class predicted for every example: regression, NER, QA) for: "
            + ", ".join(f"`{m}`" for m in results.failure_without_baseline)
            + ".",
            "",
        ]
    return lines


def _differences_section(results: StudyResults) -> list[str]:
    if not results.baseline:
        return []
    baseline = ", ".join(f"{k}={v}" for k, v in results.baseline.items())
    lines = [
        f"## Paired differences against the baseline ({_md(baseline)})",
        "",
        f"Cell − baseline cell (the same axis values but {_md(baseline)}), runs paired by seed (only seeds "
        f"complete with a finite value in both). {results.confidence:.0%} confidence interval of the mean difference "
        f"by the {results.test} (Student's t, n − 1 degrees of freedom); p: two-sided {results.test} "
        "(scipy.stats.ttest_rel). Fewer than 2 pairs: no interval.",
        "",
        "| cell | baseline cell | metric | pairs | mean difference | std | 95% CI | p |",
        "|---|---|---|---:|---:|---:|---|---:|",
    ]
    for d in results.differences:
        ci = "–" if d.ci_low is None else f"[{_num(d.ci_low)}, {_num(d.ci_high)}]"
        lines.append(
            f"| {_md(d.cell)} | {_md(d.baseline_cell)} | {_md(d.metric)} | {d.n_pairs} | {_num(d.mean)} | "
            f"{_num(d.std)} | {ci} | {_num(d.p_value, 3)} |"
        )
    if results.no_partner:
        lines += ["", "No baseline cell to pair with: " + ", ".join(results.no_partner) + "."]
    return lines + [""]


def _plots_section(figures: list[Figure], left_out: int) -> list[str]:
    if not figures:
        return []
    lines = ["## Plots", "", "Error bars: standard deviation over the seeds.", ""]
    lines += [f"![{f.caption}](plots/{f.file})" for f in figures]
    if left_out:
        cap = plots.MAX_FIGURES
        lines += ["", f"{left_out} more figure(s) not drawn (at most {cap}); every number is in results.csv."]
    return lines + [""]


def _entry(stats: MetricStats) -> str:
    extras = [f"{count} {what}" for count, what in ((stats.nan, "nan"), (stats.missing, "missing")) if count]
    if not stats.n and not extras:
        return "–"
    value = "–" if stats.mean is None else _num(stats.mean) + ("" if stats.std is None else f" ± {_num(stats.std)}")
    return f"{value} ({', '.join([str(stats.n), *extras])})"


def _num(value: Optional[float], digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def _md(value: Any) -> str:
    return str(value).replace("|", "\\|")


def _csv(value: Any) -> Any:
    return "" if value is None else value
