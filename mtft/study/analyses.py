"""The study analyses by name, and how a study builds and writes them: ``analyses: {name: {options}}``.

The runner asks this registry, never a name: a new analysis is a :class:`~mtft.study.analysis.StudyAnalysis`
subclass (the base, :mod:`mtft.study.analysis`) enrolled in :data:`REGISTRY` (a :class:`mtft.core.registry.Registry`,
by a loader: an analysis imports its plotting only when a study asks for it), or named ``package.module:Class`` in
the study file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtft.core.atomic import AtomicFolder
from mtft.core.errors import ConfigError
from mtft.core.registry import Registry
from mtft.study.aggregate import StudyResults
from mtft.study.analysis import AnalysisOptions, StudyAnalysis
from mtft.study.plots import slug

__all__ = ["REGISTRY", "AnalysisOptions", "StudyAnalysis", "build_analyses", "write_analyses"]

REGISTRY: Registry[StudyAnalysis] = Registry("analysis", StudyAnalysis)


@REGISTRY.lazy("overtraining")
def _overtraining() -> type:
    from mtft.study.overtraining import OvertrainingAnalysis

    return OvertrainingAnalysis


@REGISTRY.lazy("spread")
def _spread() -> type:
    from mtft.study.spread import SpreadAnalysis

    return SpreadAnalysis


def build_analysis(name: str, options: dict[str, Any]) -> StudyAnalysis:
    """The analysis ``name`` (a registered name or ``module:Class``); bad options raise ValueError in one line
    (:meth:`mtft.core.registry.Registry.typed_options`: a foreign option names the analyses that take it)."""
    cls = REGISTRY.get(name)
    return cls(REGISTRY.typed_options(name, options or {}).model_dump(exclude_unset=True))


def build_analyses(requested: dict[str, dict[str, Any]], axes: list[str]) -> dict[str, StudyAnalysis]:
    """Every analysis the study asks for, built and checked against its axes; one ConfigError line otherwise."""
    built = {}
    for name, options in requested.items():
        try:
            built[name] = analysis = build_analysis(name, options)
            analysis.check(axes)
        except ValueError as error:
            raise ConfigError(f"analyses: {error}") from None
    return built


def write_analyses(
    study_dir: Path, analyses: dict[str, StudyAnalysis], records: list[dict[str, Any]], results: StudyResults
) -> list[str]:
    """Each analysis's folder, written whole, and the study.md lines of all of them."""
    lines: list[str] = []
    for name, analysis in analyses.items():
        folder = Path(study_dir) / "analyses" / slug(name)  # module:Class has a colon: not a folder name
        folder.parent.mkdir(parents=True, exist_ok=True)
        with AtomicFolder(folder).writing(kind="study analysis", analysis=name) as partial:
            lines += analysis.write(partial, f"analyses/{folder.name}", records, results)
    return lines
