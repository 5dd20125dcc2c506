"""A task kind added from outside the library (issue 39): one module beside its task file -- a Task and a Head class
and one ``register_kind`` call -- trains through run.py and predicts through ``mtft.api``, whose rows carry what the
kind says of them (its own field and its own probabilities), without a line of mtft knowing the kind's name."""

from __future__ import annotations

import math

import pytest

from tests.helpers.launch import run_cli
from tests.helpers.plugin_kind import write_kind_task
from tests.helpers.runs import BASE_CONFIG, base_overrides


@pytest.fixture(autouse=True)
def kinds_restored():
    """The kind's module, imported in this process by load_run(trust_plugins=True), enrols its kind: take it out
    again, so that later tests in this process see the registries as mtft ships them."""
    from mtft.tasks.kinds import HEAD_CLASSES, TASK_CLASSES

    saved = TASK_CLASSES.snapshot(), HEAD_CLASSES.snapshot()
    yield
    TASK_CLASSES.restore(saved[0])
    HEAD_CLASSES.restore(saved[1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("new_kind")
    tasks = write_kind_task(folder / "tasks")
    out = folder / "run"
    overrides = base_overrides(
        out,
        4,
        **{
            "data.tasks": "[{name: nli_tempered, max_train_examples: 40}]",
            "data.task_dirs": f"[{tasks}]",
            "evaluation.every_steps": 4,
            "checkpointing.every_steps": 4,
            "evaluation.metric_for_best": "nli_tempered/accuracy",
        },
    )
    result = run_cli("--config", BASE_CONFIG, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_a_kind_added_beside_its_task_file_trains_and_predicts_through_the_api(trained):
    from mtft.api import load_run

    run = load_run(trained, trust_plugins=True)  # the kind's module is the run's plug-in code
    rows = run.predict(
        "nli_tempered", [{"premise": "Der Hund schläft.", "hypothesis": "Ein Tier ruht."}], language="de"
    )
    (row,) = rows
    labels = list(row["probabilities"])
    assert row["label_index"] == labels.index(row["prediction"])  # the kind's own field
    assert math.isclose(sum(row["probabilities"].values()), 1.0, rel_tol=1e-6)
    assert type(run.loaded.model.heads["nli_tempered"]).__name__ == "TemperedHead"  # its probabilities gave those


def test_without_trust_the_kinds_module_is_not_imported(trained):
    """The kind lives in the run's plug-in code: reading the run without --trust-plugins imports none of it."""
    from mtft.api import load_run
    from mtft.core.errors import UserError

    with pytest.raises(UserError, match="trust"):
        load_run(trained)
