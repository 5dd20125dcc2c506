"""The base of study analyses: an analysis a study file asks for by name, beyond the tables every study gets.

An analysis adds numbers to every complete run's record (read from the run directory, like the run summaries of
:mod:`mtft.study.collect`), so that they are aggregated, tabled and plotted with the rest; and, once the study is
aggregated, writes its own files under ``<study>/analyses/<name>/`` (one folder, written whole) and a section of
study.md. The registry of the analyses, and how a study builds them: :mod:`mtft.study.analyses`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from mtft.study.aggregate import StudyResults


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
