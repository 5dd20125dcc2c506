"""Leave-one-out model stability of a study's cells, from the final weights of paired runs on S and S^i.

Fu, So & Collier (2023) measure stability by the distance between the parameters an algorithm A returns on the
training set S and on S^i, S with example i removed: Def. 2.1 (after Schliserman & Koren, 2022)
E_S ||A(S^i) − A(S)||, and for head tuning, whose linear head grows without bound on separable data (Soudry et
al., 2018), the normalised Def. 2.3 E_S ||A(S^i)/||A(S^i)|| − A(S)/||A(S)||||. Here A(S) is the vector of the
*trained part* of a run -- the parameters its ``model.adapter.method`` leaves trainable (encoder and heads for full
fine-tuning, the heads for head tuning, the adapters and heads for LoRA-type methods), read from the run's final
checkpoint (its newest complete ``checkpoints/step-N``, what ``run.py export`` ships by default); an MHLoss run's
H stacked heads count as the averaged head it predicts and exports with. Norms are Euclidean over all those
tensors concatenated, in float64. The expectation is the mean over the study's seeds and ``leave_one_out.draws``.

Which parameters train is asked of the adapter method itself: the run's model is rebuilt as
:func:`mtft.training.restore.load_run` builds it (the study never imports training), on the meta device so no
weights are allocated, and its ``requires_grad`` parameters are the trained part; the e2e study test checks the
two agree.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import torch
from safetensors import safe_open

from mtft.adapters import parameter_table
from mtft.core.atomic import is_complete, write_json, write_text
from mtft.core.errors import CheckpointError, UserError, shorten
from mtft.models.folders import read_json, reading
from mtft.models.multihead import collapse_stacked_heads
from mtft.runs import read_run_config, rebuild_model
from mtft.study.plan import PlannedRun
from mtft.study.state import is_finished

WEIGHTS = "model.safetensors"


@dataclass
class TrainedPart:
    """The trained parameters of a run: name -> shape (in the one-head model), and what they are."""

    shapes: dict[str, tuple[int, ...]]
    description: str  # e.g. "encoder weights + task heads"
    size: int  # number of trained weights


@dataclass
class PairDistance:
    cell: str
    seed: int
    draw: int
    distance: float  # ||A(S^i) − A(S)||, Def. 2.1
    normalized: float  # ||A(S^i)/||A(S^i)|| − A(S)/||A(S)||||, Def. 2.3


@dataclass
class Summary:
    """Over a cell's measured pairs (every seed and draw): mean, sample std (ddof=1), min, max."""

    n: int
    mean: Optional[float] = None
    std: Optional[float] = None
    min: Optional[float] = None
    max: Optional[float] = None


@dataclass
class CellStability:
    name: str
    axes: dict[str, Any]
    trained_part: str  # what A(S) is, e.g. "task heads (2,450 weights)"
    distance: Summary
    normalized: Summary
    pairs: list[PairDistance] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # "<pair>: why" for pairs not (yet) measured


def final_checkpoint(run_dir: Path) -> Path:
    """The run's newest complete ``checkpoints/step-N``: its final weights (saved before the final evaluation)."""
    folder = Path(run_dir) / "checkpoints"
    steps = [p for p in folder.glob("step-*") if p.name[5:].isdigit() and is_complete(p)] if folder.is_dir() else []
    if not steps:
        raise CheckpointError(f"{run_dir} has no complete checkpoint")
    return max(steps, key=lambda p: int(p.name[5:]))


def trained_part(run_dir: Path, checkpoint: Path) -> TrainedPart:
    """The parameters the run's adapter method trains, from a meta-device rebuild of its model: the run loader's
    own rebuild (:func:`mtft.runs.rebuild_model`), head kinds of task plug-ins included."""
    with reading(f"{run_dir}/config.yaml"):
        config = read_run_config(Path(run_dir))
    heads = read_json(checkpoint / "heads.json")
    with reading(checkpoint / "trainer_state.json"):
        objectives = list(read_json(checkpoint / "trainer_state.json")["objectives"])
    model, _ = rebuild_model(Path(run_dir), config, heads, objectives, checkpoint / "heads.json", device="meta")
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
    parts = [part for part, _, trainable in parameter_table(model)[:-1] if trainable]
    return TrainedPart(shapes, " + ".join(parts), sum(math.prod(s) for s in shapes.values()))


def weight_distances(file_s: Path, file_si: Path, shapes: dict[str, tuple[int, ...]]) -> tuple[float, float]:
    """(||a − b||, ||a/||a|| − b/||b|||) over the tensors ``shapes`` names, a from ``file_s`` and b from
    ``file_si`` (safetensors files), in float64; a tensor stacked over MHLoss heads is first averaged. Two passes,
    tensor by tensor, so that no more than two tensors are held at once; the normalised distance is summed
    directly rather than as 2 − 2cos, which would cancel for nearby weights."""
    with safe_open(str(file_s), framework="pt") as a_file, safe_open(str(file_si), framework="pt") as b_file:

        def pair(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            expected = {name: torch.empty(shapes[name], device="meta")}
            out = []
            for source, file in ((a_file, file_s), (b_file, file_si)):
                if name not in source.keys():
                    raise CheckpointError(f"{file} has no {name}, a trained parameter of the run")
                tensor = collapse_stacked_heads({name: source.get_tensor(name)}, expected)[name]
                if tuple(tensor.shape) != shapes[name]:
                    raise CheckpointError(f"{file}: {name} has shape {tuple(tensor.shape)}, not {shapes[name]}")
                out.append(tensor.to(torch.float64))
            return out[0], out[1]

        diff = norm_a = norm_b = 0.0
        for name in shapes:
            a, b = pair(name)
            diff += float((a - b).pow(2).sum())
            norm_a += float(a.pow(2).sum())
            norm_b += float(b.pow(2).sum())
        norm_a, norm_b = math.sqrt(norm_a), math.sqrt(norm_b)
        if norm_a == 0.0 or norm_b == 0.0:
            return math.sqrt(diff), math.nan  # a zero vector has no direction
        normalized = 0.0
        for name in shapes:
            a, b = pair(name)
            normalized += float((a / norm_a - b / norm_b).pow(2).sum())
    return math.sqrt(diff), math.sqrt(normalized)


def measure(runs: list[PlannedRun], cells: list[str], failed: Mapping[str, str] = {}) -> list[CellStability]:
    """Per cell (in ``cells``' order), the distance of every finished (S, S^i) pair of its runs; a pair not measured
    is listed with why: a failed run (``failed``: run key -> its error line) with its error line."""
    on_s = {(r.cell.name, r.seed): r for r in runs if r.draw is None}
    results = {name: CellStability(name, {}, "", Summary(0), Summary(0)) for name in cells}
    for run in runs:
        if run.draw is None:
            continue
        cell, base = results[run.cell.name], on_s[run.cell.name, run.seed]
        cell.axes = dict(run.cell.axes)
        if run.key in failed:  # its error line, as the failed runs on S have theirs
            cell.missing.append(f"{run.key}: failed: {shorten(failed[run.key])}")
            continue
        if base.key in failed:
            cell.missing.append(f"{run.key}: its run on S, {base.key}, failed: {shorten(failed[base.key])}")
            continue
        if not (is_finished(base.run_dir) and is_finished(run.run_dir)):
            cell.missing.append(f"{run.key}: not finished (or its run on S, {base.key})")
            continue
        try:
            checkpoint = final_checkpoint(base.run_dir)
            part = trained_part(base.run_dir, checkpoint)
            distance, normalized = weight_distances(
                checkpoint / WEIGHTS, final_checkpoint(run.run_dir) / WEIGHTS, part.shapes
            )
        except (UserError, OSError, ValueError, KeyError, RuntimeError) as error:  # listed in study.md with why
            cell.missing.append(f"{run.key}: {shorten(str(error))}")
            continue
        cell.trained_part = f"{part.description} ({part.size:,} weights)"
        cell.pairs.append(PairDistance(run.cell.name, run.seed, int(run.draw), distance, normalized))
    for cell in results.values():
        cell.distance = summarize([p.distance for p in cell.pairs])
        cell.normalized = summarize([p.normalized for p in cell.pairs])
    return [results[name] for name in cells]


def summarize(values: list[float]) -> Summary:
    finite = np.array([v for v in values if math.isfinite(v)], dtype=np.float64)
    if not len(finite):
        return Summary(0)
    std = float(finite.std(ddof=1)) if len(finite) > 1 else None
    return Summary(len(finite), float(finite.mean()), std, float(finite.min()), float(finite.max()))


def write(root: Path, cells: list[CellStability]) -> None:
    """``loo.json`` (every pair and summary) and the study.md section (appended to the file just written)."""
    write_json(Path(root) / "loo.json", [asdict(cell) for cell in cells])
    study_md = Path(root) / "study.md"
    text = study_md.read_text(encoding="utf-8") if study_md.is_file() else ""
    write_text(study_md, text.rstrip("\n") + "\n\n" + "\n".join(markdown(cells)) + "\n")


def markdown(cells: list[CellStability]) -> list[str]:
    lines = [
        "## Leave-one-out stability",
        "",
        "Per cell, over its (seed, draw) pairs of a run on S and one on S^i (same seed, the draw's examples removed; "
        "Fu, So & Collier, 2023): Def. 2.1 E||A(S^i) − A(S)|| and the normalised Def. 2.3 "
        "E||A(S^i)/||A(S^i)|| − A(S)/||A(S)|||| (the paper's measure for head tuning), A = the trained part's final "
        "weights. Mean ± sample standard deviation (pairs measured); loo.json has every pair.",
        "",
        "| cell | trained part (A) | ‖A(S^i) − A(S)‖ | normalised | not measured |",
        "|---|---|---:|---:|---:|",
    ]
    for c in cells:
        part = c.trained_part or "–"
        lines.append(
            f"| {_md(c.name)} | {_md(part)} | {_entry(c.distance)} | {_entry(c.normalized)} | {len(c.missing)} |"
        )
    missing = [m for c in cells for m in c.missing]
    if missing:
        lines += ["", "Pairs not measured:", ""] + [f"- {_md(m)}" for m in missing]
    return lines + [""]


def _entry(stats: Summary) -> str:
    if stats.mean is None:
        return "–"
    return f"{stats.mean:.4g}" + ("" if stats.std is None else f" ± {stats.std:.4g}") + f" ({stats.n})"


def _md(value: Any) -> str:
    return str(value).replace("|", "\\|")
