"""Study analyses by name (mtft/study/analyses.py): the registry, options and axes checked in one line, the folder
written whole, and the runs' extra numbers merged into their records."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtft.core.errors import ConfigError
from mtft.study.aggregate import aggregate
from mtft.study.analyses import REGISTRY, build_analyses, write_analyses
from mtft.study.analysis import StudyAnalysis
from mtft.study.overtraining import OvertrainingAnalysis
from mtft.study.plots import slug


class Counting(StudyAnalysis):
    """A test analysis: one number per run, a one-line section, one file."""

    def run_metrics(self, run_dir: Path) -> dict[str, float]:
        return {"files": float(len(list(Path(run_dir).iterdir())))}

    def write(self, folder, link, records, results):
        (folder / "n.txt").write_text(str(len(records)))
        return [f"{len(records)} records, see {link}/n.txt"]


def test_a_registered_name_builds_its_analysis_with_options():
    built = build_analyses({"overtraining": {"task_metrics": ["xnli/accuracy"]}}, ["pretrain.tokens", "lr"])
    assert isinstance(built["overtraining"], OvertrainingAnalysis) and "overtraining" in REGISTRY
    assert built["overtraining"].options.task_metrics == ["xnli/accuracy"]


@pytest.mark.parametrize(
    "requested, message",
    [
        ({"nope": {}}, "unknown analysis 'nope'; valid choices: overtraining, spread; or module:Class"),
        ({"overtraining": {"budget": 1}}, "'budget' is not an option of analysis 'overtraining'; valid options: "),
        ({"overtraining": {"tolerance": -1}}, "option 'tolerance'"),
        ({"overtraining": {}}, "budget_axis 'pretrain.tokens' is not an axis of the study (axes: lr)"),
        ({"no.such.module:X": {}}, "'no.such.module:X': cannot import 'no.such.module' (No module named 'no')"),
        ({"mtft.study.aggregate:StudyResults": {}}, "StudyResults is not a subclass of mtft.study.analysis.StudyA"),
    ],
)
def test_bad_analyses_are_one_config_error(requested, message):
    with pytest.raises(ConfigError, match="^analyses: ") as error:
        build_analyses(requested, ["lr"])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_analysis_by_module_and_class_writes_its_folder_whole(tmp_path):
    built = build_analyses({f"{__name__}:Counting": {}}, [])
    (analysis,) = built.values()
    run = tmp_path / "run"
    run.mkdir()
    (run / "a").write_text("x")
    assert analysis.run_metrics(run) == {"files": 1.0}
    results = aggregate([], [], ["*"], None, [])
    lines = write_analyses(tmp_path / "study", built, [{"status": "complete"}], results)
    folder = tmp_path / "study" / "analyses" / slug(f"{__name__}:Counting")  # the colon is no folder name
    assert (folder / "n.txt").read_text() == "1" and (folder / "COMPLETE").is_file()
    assert lines == [f"1 records, see analyses/{folder.name}/n.txt"]
    assert not list((tmp_path / "study" / "analyses").glob("*.partial"))
