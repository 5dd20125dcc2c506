"""Analyses a study file asks for by name, beyond the tables every study gets: ``analyses: {name: {options}}``.

An analysis adds numbers to every complete run's record (read from the run directory, like the run summaries of
:mod:`mtft.study.collect`), so that they are aggregated, tabled and plotted with the rest; and, once the study is
aggregated, writes its own files under ``<study>/analyses/<name>/`` (one folder, written whole) and a section of
study.md. The runner asks the registry, never a name: a new analysis is a :class:`StudyAnalysis` subclass enrolled
in :data:`REGISTRY` (a :class:`mtft.core.registry.Registry`, by a loader: an analysis imports its plotting only when
a study asks for it), or named ``package.module:Class`` in the study file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from mtft.core.atomic import AtomicFolder
from mtft.core.errors import ConfigError
from mtft.core.registry import Registry
from mtft.study.aggregate import StudyResults
from mtft.study.plots import slug


class AnalysisOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StudyAnalysis:
    """One analysis with its validated options (``Options``, a pydantic model of the study file's mapping)."""

    Options: ClassVar[type[AnalysisOptions]] = AnalysisOptions
    name: ClassVar[str] = ""

    def __init__(self, options: dict[str, Any]):
        self.options = self.Options.model_validate(options or {})

    def check(self, axes: list[str]) -> None:
        """Raise ValueError when the study's ``axes`` do not suit the analysis (checked before anything runs)."""

    def run_metrics(self, run_dir: Path) -> dict[str, float]:
        """Extra numbers of one complete run (its directory), merged into its record's metrics."""
        return {}

    def write(self, folder: Path, link: str, records: list[dict[str, Any]], results: StudyResults) -> list[str]:
        """Write the analysis's files into ``folder``, which becomes ``link`` (relative to the study directory:
        ``analyses/<name>``); returns the lines of its section of study.md, linking to ``link/<file>``."""
        return []


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
