"""From a study file to its runs: cells (grid product × variants), seeds, and each run's validated config.

Every run config is resolved and validated here, before anything runs, so a bad key in one cell stops the study
with the same one-line error ``run.py --config`` gives, naming the cell.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from mtft.config.deepspeed import check_forgetting, read_deepspeed_json, use_bf16
from mtft.config.load import (
    config_to_yaml,
    gradients_of_a_written_config,
    options_follow_methods,
    read_yaml_mapping,
    set_dotted,
    validate_config,
)
from mtft.config.run_config import RunConfig
from mtft.core.errors import ConfigError, UserError
from mtft.data.selection import check_tasks
from mtft.models.backbone import check_backbone
from mtft.study.spec import StudySpec


@dataclass(frozen=True)
class Cell:
    """One combination of axis values: its folder name, its value on every axis, the run-config overrides."""

    name: str
    axes: dict[str, Any]
    overrides: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class PlannedRun:
    cell: Cell
    seed: int
    run_dir: Path
    config_path: Path  # the resolved config the job launches: <study>/configs/<cell>/<slot>.yaml
    config_yaml: str = field(repr=False)
    draw: Optional[int] = None  # leave_one_out: the run on S^i of this draw, paired with the seed's run on S

    @property
    def slot(self) -> str:
        """The run's name within its cell: ``seed-<n>``, or ``seed-<n>-loo-<i>`` for leave-one-out draw i."""
        return f"seed-{self.seed}" if self.draw is None else f"seed-{self.seed}-loo-{self.draw}"

    @property
    def key(self) -> str:
        return f"{self.cell.name}/{self.slot}"


def expand_cells(spec: StudySpec) -> list[Cell]:
    """Variants × factors × the grid's cartesian product, in file order (the first axis varies slowest), less the
    cells an ``exclude`` entry names."""
    keys = list(spec.grid)
    short = _short_names(keys)
    named: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = []  # axis -> [(level, overrides)]
    if spec.variants:
        named.append(("variant", [(v.name, v.overrides) for v in spec.variants]))
    named += [(axis, list(levels.items())) for axis, levels in spec.factors.items()]
    cells, seen = [], set()
    for levels in itertools.product(*(choices for _, choices in named)):
        for values in itertools.product(*(spec.grid[k] for k in keys)):
            axes: dict[str, Any] = {axis: level for (axis, _), (level, _) in zip(named, levels)}
            axes.update(zip(keys, values))
            if spec.excludes(axes):
                continue
            overrides = {key: value for _, level in levels for key, value in level.items()}
            overrides.update(zip(keys, values))
            parts = [level for level, _ in levels] + [f"{short[k]}-{_slug(v)}" for k, v in zip(keys, values)]
            name = "_".join(parts) or "base"
            if name in seen:  # two values with the same slug (e.g. 1e-3 and 0.001): keep them apart
                name += "-" + hashlib.sha256(repr(values).encode()).hexdigest()[:6]
            seen.add(name)
            cells.append(Cell(name, axes, overrides))
    return cells


def plan_runs(spec: StudySpec, base: Path, study_file: Path) -> list[PlannedRun]:
    """Every (cell, seed) run with its resolved, validated config, each followed by its ``leave_one_out`` draws,
    seed by seed; the first invalid cell raises one line."""
    raw_base = read_yaml_mapping(base)
    gradients_of_a_written_config(raw_base)
    checked: set[str] = set()
    draws = range(spec.leave_one_out.draws) if spec.leave_one_out else range(0)
    runs: list[PlannedRun] = []
    cells = expand_cells(spec)
    if not cells:
        raise ConfigError(f"{study_file}: exclude leaves out every cell of the study; there is nothing to run")
    # seed by seed, every cell of a seed before the next seed: a study stopped part-way (or still running) has
    # whole seeds of every cell, the pairs its paired differences compare, rather than some cells only
    for seed in spec.seed_list:
        for cell in cells:
            if seed in spec.seeds_of(cell.axes):
                runs.append(_planned(spec, raw_base, study_file, cell, seed, None, checked))
                runs += [_planned(spec, raw_base, study_file, cell, seed, draw, checked) for draw in draws]
    return runs


def _planned(
    spec: StudySpec,
    raw_base: dict[str, Any],
    study_file: Path,
    cell: Cell,
    seed: int,
    draw: Optional[int],
    checked: set[str],
) -> PlannedRun:
    """One run of ``cell`` with ``seed``: on S, or on S^i of leave-one-out draw ``draw``."""
    where = f"{study_file} [cell {cell.name}]"
    slot = f"seed-{seed}" if draw is None else f"seed-{seed}-loo-{draw}"
    run_dir = spec.directory / "runs" / cell.name / slot
    fixed: dict[str, Any] = {key: seed for key in spec.seed_keys}
    fixed["run.output_dir"] = str(run_dir)
    fixed["run.name"] = f"{cell.name}-seed{seed}" + ("" if draw is None else f"-loo{draw}")
    raw = copy.deepcopy(raw_base)
    try:
        _check_not_owned({**spec.overrides, **cell.overrides}, list(fixed))
        options_follow_methods(raw, list({**spec.overrides, **cell.overrides}.items()))
        for key, value in {**spec.overrides, **cell.overrides, **fixed}.items():
            set_dotted(raw, key, copy.deepcopy(value))
        data = raw.get("data")
        if spec.leave_one_out and isinstance(data, dict) and data.get("leave_out") is not None:
            raise ConfigError("data.leave_out is set by the study's leave_one_out; leave it out of the run configs")
        if spec.leave_one_out and draw is not None:
            set_dotted(raw, "data.leave_out", spec.leave_one_out.leave_out(draw))
        config = validate_config(raw, source=where, overridden=set())
    except ConfigError as error:
        message = str(error)
        raise ConfigError(message if f"[cell {cell.name}]" in message else f"{where}: {message}") from None
    if config.run.resume or config.run.overwrite:
        raise ConfigError(
            f"{where}: run.resume / run.overwrite are decided by the study "
            "(finished runs are kept, interrupted ones resumed); leave them out of the study's configs"
        )
    _check_once(config, where, checked)
    path = spec.directory / "configs" / cell.name / f"{slot}.yaml"
    return PlannedRun(cell, seed, run_dir, path, config_to_yaml(config), draw)


def _check_not_owned(overrides: dict[str, Any], owned: list[str]) -> None:
    """A key the study sets for every run (its folder, its name, its seeds) is refused in the overrides, nested
    (``{run: {output_dir: ...}}``) or dotted: the study would otherwise have to silently drop it, or let a run be
    written outside the study's folder."""
    for key in _flatten(overrides):
        for own in owned:
            if key == own or key.startswith(f"{own}.") or own.startswith(f"{key}."):
                raise ConfigError(
                    f"'{own}' is set by the study itself (each run's folder, name and seeds); "
                    "leave it out of the study's overrides, variants and factors"
                )


def _check_once(config: RunConfig, where: str, checked: set[str]) -> None:
    """What ``run.py`` checks before it starts (tasks, languages, metric, local data files, the backbone's location),
    once per distinct task/model set-up: a study of learning rates checks its data once, not once per cell. The
    DeepSpeed JSON (relative to this folder, the runs' working directory too), the precision and what the JSON's
    ZeRO stage rules out for the forgetting monitors, every cell."""
    try:
        read_deepspeed_json(config.training.deepspeed_config)
        use_bf16(config.training)
        check_forgetting(config)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    key = json.dumps([config.data.model_dump(mode="json"), config.evaluation.metric_for_best, config.model.backbone])
    if key in checked:
        return
    try:
        check_tasks(config.data, config.evaluation)
        check_backbone(config.model)
    except UserError as error:
        raise ConfigError(f"{where}: {error}") from None
    checked.add(key)


def config_difference(old_yaml: str, new_yaml: str) -> str | None:
    """The first dotted key at which two resolved configs differ, or None when they are the same run. A key the old
    config lacks counts only if its new value differs from the key's default: a newer mtft adding an option with
    its default does not change a run already made; nor does a key that moved since (the ``gradients`` keys an
    earlier mtft wrote under ``weighting``)."""
    old_tree = yaml.safe_load(old_yaml) or {}
    if isinstance(old_tree, dict):
        gradients_of_a_written_config(old_tree)
    old, new = _flatten(old_tree), _flatten(yaml.safe_load(new_yaml) or {})
    for key in sorted(set(old) | set(new)):
        if key not in old and _is_default(key, new[key]):
            continue
        if old.get(key, "<absent>") != new.get(key, "<absent>"):
            return f"{key}: {old.get(key, '<absent>')!r} then, {new.get(key, '<absent>')!r} now"
    return None


def _is_default(key: str, value: Any) -> bool:
    """Whether ``value`` is the schema's default for the dotted run-config ``key``."""
    model: Any = RunConfig
    *sections, name = key.split(".")
    for section in sections:
        field = getattr(model, "model_fields", {}).get(section)
        if field is None or not isinstance(field.annotation, type):
            return False
        model = field.annotation
    field = getattr(model, "model_fields", {}).get(name)
    if field is None:
        return False
    default = field.get_default(call_default_factory=True)
    return yaml.safe_load(yaml.safe_dump(default)) == value if not hasattr(default, "model_dump") else False


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _short_names(keys: list[str]) -> dict[str, str]:
    """Each axis by its last dotted part (``lr`` for ``training.optimizer.lr``), longer where two would clash."""
    for depth in range(1, max((k.count(".") + 1 for k in keys), default=1) + 1):
        short = {k: ".".join(k.split(".")[-depth:]) for k in keys}
        if len(set(short.values())) == len(keys):
            return short
    return {k: k for k in keys}


def _slug(value: Any) -> str:
    """A value as a folder-name part: 0.001, -1.0 (a minus stays), en.de for [en, de], key-value for a mapping."""
    if isinstance(value, (list, tuple)):
        return ".".join(_slug(v) for v in value) or "none"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = repr(value)
    else:
        text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True)
        text = text.removesuffix("\n").removesuffix("...").strip()
        text = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:40].rstrip("-.") or "x"
