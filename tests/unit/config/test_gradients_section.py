"""The ``gradients:`` section: how the per-objective gradients are formed, apart from the weighting that combines
them. Its six keys were written under ``weighting:`` before: such a config (a file, an override, a study's cell) is
refused in one line saying what to rename, while a run folder's config.yaml written then is read with them moved, so
that its run resumes and its study continues."""

from __future__ import annotations

import pytest
import yaml

from mtft.cli import options_help, sections_help
from mtft.config import config_to_yaml, load_config, validate_config
from mtft.config.bufferless import second_backward_refusal
from mtft.config.run_config import RunConfig
from mtft.config.schema import MOVED_TO_GRADIENTS, GradientsSection, WeightingSection
from mtft.core.errors import ConfigError
from mtft.study.plan import config_difference
from tests.helpers.launch import REPO
from tests.helpers.runs import BASE_CONFIG

#: an old key under weighting, a value of it that the new key accepts, and the new key
OLD_KEYS = [
    ("gradient_buffers", "none", "gradients.buffers"),
    ("gradient_buffers_budget_gb", 2, "gradients.budget_gb"),
    ("bufferless_chunk_mb", 4, "gradients.chunk_mb"),
    ("bufferless_update", "backward", "gradients.update"),
    ("metric", "optimizer", "gradients.metric"),
    ("descent_check", True, "gradients.descent_check"),
]


def load(*overrides: str):
    return load_config(REPO / BASE_CONFIG, list(overrides))


def base_raw() -> dict:
    return yaml.safe_load((REPO / BASE_CONFIG).read_text())


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value).strip()
    assert "\n" not in text
    return text


def test_the_section_holds_the_six_keys_and_the_weighting_none_of_them():
    assert set(GradientsSection.model_fields) == set(MOVED_TO_GRADIENTS.values())
    assert not set(WeightingSection.model_fields) & set(MOVED_TO_GRADIENTS)
    fields = list(RunConfig.model_fields)
    assert fields.index("gradients") == fields.index("weighting") + 1
    config = load()
    assert config.gradients == GradientsSection()
    assert (config.gradients.buffers, config.gradients.update, config.gradients.metric) == ("full", "tape", "euclidean")
    written = yaml.safe_load(config_to_yaml(config))
    assert set(written["gradients"]) == set(GradientsSection.model_fields)
    assert not set(written["weighting"]) & set(MOVED_TO_GRADIENTS)


def test_every_description_names_the_new_keys():
    for name, field in GradientsSection.model_fields.items():
        description = field.description or ""
        assert description, name
        for old in ("gradient_buffers", "bufferless_", "weighting.metric", "weighting.descent_check"):
            assert old not in description, (name, old)


@pytest.mark.parametrize("old, value, new", OLD_KEYS)
def test_an_old_key_on_the_command_line_is_refused_naming_its_new_place(old, value, new):
    with pytest.raises(ConfigError) as error:
        load(f"weighting.{old}={str(value).lower()}")
    text = one_line(error)
    assert f"[command line]: weighting.{old} moved to {new}:" in text
    assert "unknown key" not in text


def test_old_keys_in_a_file_are_refused_in_one_line_listing_every_rename(tmp_path):
    raw = base_raw()
    raw["weighting"].update(gradient_buffers="none", bufferless_update="backward", descent_check=False)
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    text = one_line(error)
    assert text.startswith(
        f"{path}: weighting.gradient_buffers moved to gradients.buffers (and weighting.bufferless_update -> "
        "gradients.update, weighting.descent_check -> gradients.descent_check)"
    )
    assert "[command line]" not in text


def test_a_study_cell_with_an_old_key_is_refused_in_one_line():
    raw = base_raw()
    raw["weighting"]["metric"] = "optimizer"
    with pytest.raises(ConfigError) as error:
        validate_config(raw, source="study.yaml [cell lfmlf-adam-metric]")
    assert one_line(error).startswith("study.yaml [cell lfmlf-adam-metric]: weighting.metric moved to gradients.metric")


def written_before_the_section(config: RunConfig) -> dict:
    """``config`` as an earlier mtft wrote a run folder's config.yaml: the gradients keys under weighting."""
    saved = yaml.safe_load(config_to_yaml(config))
    gradients = saved.pop("gradients")
    new_to_old = {new: old for old, new in MOVED_TO_GRADIENTS.items()}
    saved["weighting"].update({new_to_old[key]: value for key, value in gradients.items()})
    return saved


def test_a_run_folders_config_written_before_the_section_is_read_with_its_keys_moved(tmp_path):
    config = load("gradients.buffers=none", "gradients.update=backward", "gradients.chunk_mb=4")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(written_before_the_section(config)))
    read = load_config(path)
    assert read.gradients == config.gradients
    assert read.model_dump(mode="json") == config.model_dump(mode="json")
    # an old key given on top of it is still a mistake of today's
    with pytest.raises(ConfigError, match=r"\[command line\]: weighting.bufferless_update moved to gradients.update"):
        load_config(path, ["weighting.bufferless_update=tape"])
    # the new key overrides the moved one
    assert load_config(path, ["gradients.chunk_mb=8"]).gradients.chunk_mb == 8


def test_a_study_run_recorded_before_the_section_is_the_same_run():
    config = load("gradients.metric=optimizer", "gradients.descent_check=true")
    old = yaml.safe_dump(written_before_the_section(config))
    assert config_difference(old, config_to_yaml(config)) is None
    changed = load("gradients.metric=optimizer")  # no descent check now: another run
    assert config_difference(old, config_to_yaml(changed)) == "gradients.descent_check: True then, False now"


def test_a_setting_the_chosen_buffers_never_read_is_refused_naming_the_new_keys():
    with pytest.raises(ConfigError) as error:
        load("gradients.update=backward", "gradients.chunk_mb=4")
    assert (
        "gradients: gradients.update, gradients.chunk_mb set the bufferless step, which gradients.buffers=full "
        "never takes; use gradients.buffers=none (or auto)" in one_line(error)
    )
    with pytest.raises(ConfigError) as error:
        load("gradients.budget_gb=1")
    assert "gradients.budget_gb decides gradients.buffers=auto's choice" in one_line(error)


def test_the_metric_of_the_gram_needs_a_weighting_that_reads_one():
    with pytest.raises(ConfigError) as error:
        load("weighting.method=mean", "gradients.metric=optimizer")
    assert (
        "gradients.metric=optimizer is the inner product of the Gram, and weighting.method=mean reads no Gram; "
        "use gradients.metric=euclidean" in one_line(error)
    )
    assert load("weighting.method=lfmlf", "gradients.metric=optimizer").gradients.metric == "optimizer"


def test_the_questions_the_step_asks():
    assert load("weighting.method=lfmlf").per_objective_gradients()
    assert load("weighting.method=mean", "gradients.descent_check=true").per_objective_gradients()
    assert not load("weighting.method=mean").per_objective_gradients()
    assert GradientsSection(buffers="auto", update="backward").may_update_by_second_backward()
    assert not GradientsSection(buffers="none").may_update_by_second_backward()


def test_the_second_backward_rule_names_the_new_keys():
    messages = [
        second_backward_refusal(micro_batches=2),
        second_backward_refusal(descent_check=True),
        second_backward_refusal(processes=2),
        second_backward_refusal(zero3=True),
    ]
    for message in messages:
        assert message and "gradients.update=backward" in message and "weighting." not in message
    assert "gradients.descent_check=true" in messages[1]
    with pytest.raises(ConfigError) as error:
        load("gradients.buffers=none", "gradients.update=backward", "gradients.descent_check=true")
    assert "use gradients.update=tape" in one_line(error)


def test_help_lists_the_section_and_its_keys():
    assert any(line.split()[:1] == ["gradients"] for line in sections_help().splitlines())
    text = options_help("gradients")
    for key in MOVED_TO_GRADIENTS.values():
        assert f"  gradients.{key}  [" in text
    weighting = options_help("weighting")
    assert not [old for old in MOVED_TO_GRADIENTS if f"  weighting.{old}  [" in weighting]
