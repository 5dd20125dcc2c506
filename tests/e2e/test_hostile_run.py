"""Every command that reads a run folder or writes a file, against ../shared/HOSTILE.md's classes: a run folder
as a colleague (or an attacker) would send it, damaged or edited by hand, and outputs that point where the user did
not mean. Each case ends in one ``error:`` line (exit 2), runs no code from the folder, writes nothing (nothing
half-written, nothing outside the named folders, the user's files byte for byte), through the shared mechanisms:
the run loader (mtft.training.restore + mtft.models.folders), the output policy (mtft.core.output) and checkpoint
pinning. The commands × faults are one table; the mechanisms' own tables are tests/unit/core/test_output.py and
tests/unit/models/test_folders.py.

One short Multi-LoRA run (4 steps, a checkpoint every 2, best/ kept) serves every case; each damaged case works
on a copy of it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE

import pytest
import torch
import yaml
from safetensors.torch import save_file

from tests.helpers.launch import REPO, WARM, clean_env, run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides, read_jsonl

EVIL = "import pathlib\npathlib.Path(__file__).with_name('CODE_RAN').write_text('ran')\nraise SystemExit(0)\n"
ROWS = [
    {"id": "doc-17", "premise": "the dog sleeps", "hypothesis": "an animal rests"},
    {"id": "doc-17", "premise": "the dog sleeps", "hypothesis": "the dog does not sleep"},
    {"id": "doc-3", "premise": "a cat", "hypothesis": "a cat indeed"},
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "run"
    extra = {
        "data.tasks": "[{name: xnli, languages: [en, de], protocol: in_language, max_train_examples: 64, "
        "max_eval_examples: 16}]",
        "model.adapter.method": "multi_lora",
        "weighting.method": "mean",
        "evaluation.every_steps": 2,
        "checkpointing.every_steps": 2,
        "checkpointing.keep_last": 1,
    }
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, 4, **extra))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "best/model.safetensors").is_file()
    return out


def _json_edit(path: Path, change) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _newest(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step-*"))[-1]


# fault: (how the copy of the run is damaged, what the one line holds)
DAMAGE = {
    "encoder-auto-map": (
        lambda r: (
            (r / "encoder/evil.py").write_text(EVIL),
            _json_edit(r / "encoder/config.json", lambda c: c.update(auto_map={"AutoConfig": "evil.Config"})),
        ),
        "encoder/config.json asks to run Python code shipped with the run folder",
    ),
    "tokenizer-auto-map": (
        lambda r: (
            (r / "encoder/evil.py").write_text(EVIL),
            _json_edit(
                r / "encoder/tokenizer_config.json", lambda c: c.update(auto_map={"AutoTokenizer": ["evil.T", None]})
            ),
        ),
        "tokenizer_config.json asks to run Python code",
    ),
    "heads-not-json": (lambda r: (r / "best/heads.json").write_text("{not json"), "best/heads.json: not JSON"),
    "heads-not-utf8": (lambda r: (r / "best/heads.json").write_bytes(b'{"\xff": 1}'), "best/heads.json: not UTF-8"),
    "heads-a-list": (lambda r: (r / "best/heads.json").write_text("[1, 2]"), "best/heads.json: expected an object"),
    "heads-missing": (lambda r: (r / "best/heads.json").unlink(), "heads.json is missing"),
    "weights-truncated": (lambda r: _truncate(r / "best/model.safetensors"), "best/model.safetensors: "),
    "weights-a-pickle": (
        lambda r: torch.save({"x": torch.zeros(2)}, r / "best/model.safetensors"),
        "best/model.safetensors: ",
    ),
    "weights-of-another-run": (
        lambda r: save_file({"encoder.x": torch.zeros(2)}, str(r / "best/model.safetensors")),
        "does not fit the run's model",
    ),
    "config-rank-edited": (
        lambda r: (r / "config.yaml").write_text((r / "config.yaml").read_text().replace("r: 16", "r: 8")),
        "does not fit the run's model",
    ),
    "encoder-hidden-size-edited": (
        lambda r: _json_edit(r / "encoder/config.json", lambda c: c.update(hidden_size=32)),
        "",  # the encoder's config.json or the weights: either file named
    ),
    "encoder-config-not-json": (lambda r: (r / "encoder/config.json").write_text("{"), "encoder/config.json: not JSON"),
    "tokenizer-missing": (
        lambda r: [p.unlink() for p in (r / "encoder").glob("tokenizer*")],
        "(its tokenizer)",
    ),
    "trainer-state-not-json": (
        lambda r: (_newest(r) / "trainer_state.json").write_text("{"),
        "trainer_state.json: not JSON",
    ),
}
# command: argv after the run copy {run} and the case folder {tmp}
COMMANDS = {
    "predict": ["predict", "--run", "{run}", "--task", "xnli", "--input", "{tmp}/in.jsonl", "--out", "{tmp}/p.jsonl"],
    "evaluate": ["evaluate", "--run", "{run}", "--out", "{tmp}/evaluation"],
    "export": ["export", "--run", "{run}", "--out", "{tmp}/export"],
    "probe": ["probe", "--checkpoint", "{run}/best", "--gamma", "0.1", "--out", "{tmp}/probe"],
}
# where a command's line differs: probe tells a folder without heads.json from a checkpoint before loading it
EXPECT = {("heads-missing", "probe"): "neither a Hugging Face folder (config.json) nor an mtft checkpoint"}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def one_line_error(result, expect: str) -> str:
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output and output.count("\n") == 0, output[-3000:]
    assert output.startswith("error: ") and expect in output, output
    return output


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("fault", sorted(DAMAGE))
def test_a_damaged_or_hostile_run_folder_is_one_line_and_runs_no_code(trained, tmp_path, fault, command):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    damage, expect = DAMAGE[fault]
    expect = EXPECT.get((fault, command), expect)
    damage(run)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    before = snapshot(tmp_path)
    argv = [a.replace("{run}", str(run)).replace("{tmp}", str(tmp_path)) for a in COMMANDS[command]]
    one_line_error(run_cli(*argv), expect)
    assert not list(tmp_path.rglob("CODE_RAN")), f"{fault}: code from the run folder ran"
    assert snapshot(tmp_path) == before, f"{fault}/{command}: something was written"


def _config_edit(run: Path, change) -> None:
    config = yaml.safe_load((run / "config.yaml").read_text())
    change(config)
    (run / "config.yaml").write_text(yaml.safe_dump(config))


def _task_plugin(run: Path) -> None:
    """A task file among the run's task copies (tasks/, which a finished run reads first), whose class: runs
    Python beside it."""
    (run / "tasks").mkdir(exist_ok=True)
    (run / "tasks/evil.py").write_text(EVIL)
    task = {"task": "evil", "class": "evil:Task", "head": "sequence_classification", "languages": ["en"]}
    task |= {"text_columns": ["premise", "hypothesis"], "metrics": ["accuracy"]}
    task["data"] = {"validation": {"path": "facebook/xnli", "name": "{language}", "split": "validation"}}
    (run / "tasks/evil.yaml").write_text(yaml.safe_dump(task))
    _config_edit(
        run, lambda c: (c["data"].update(task_dirs=[str(run / "tasks")]), c["data"]["tasks"].append({"name": "evil"}))
    )


# (fault, command): plug-in code a run folder's config.yaml names, refused unless --trust-plugins
PLUGINS = {
    ("adapter-by-path", command): (
        lambda r: _config_edit(r, lambda c: c["model"]["adapter"].update(method="evil_adapter:Method")),
        "names plug-in code (evil_adapter)",
    )
    for command in COMMANDS
} | {
    ("task-class-beside-its-file", command): (_task_plugin, "class 'evil:Task': ")
    for command in ("predict", "evaluate")  # export rebuilds the trained heads only: the task is never read
}


@pytest.mark.parametrize("fault, command", sorted(PLUGINS))
def test_plugin_code_named_by_a_run_folder_is_not_imported(trained, tmp_path, fault, command):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    damage, expect = PLUGINS[fault, command]
    damage(run)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    before = snapshot(tmp_path)
    argv = [a.replace("{run}", str(run)).replace("{tmp}", str(tmp_path)) for a in COMMANDS[command]]
    line = one_line_error(run_cli(*argv), expect)
    assert "--trust-plugins" in line
    assert not list(tmp_path.rglob("CODE_RAN")), f"{fault}: plug-in code from the run folder ran"
    assert snapshot(tmp_path) == before


def test_predict_keeps_the_inputs_ids_and_answers_repeated_ids_row_by_row(trained, tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "p.jsonl"
    argv = ["predict", "--run", str(trained), "--task", "xnli", "--input", str(tmp_path / "in.jsonl")]
    result = run_cli(*argv, "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["doc-17", "doc-17", "doc-3"]
    # each row is its own: the same rows alone give the same answers
    from mtft.api import load_run

    model = load_run(trained)
    for row, alone in zip(rows, ROWS):
        assert same(model.predict("xnli", [alone])[0], row)
    # chunked (two rows a chunk) gives what one chunk gives
    assert all(same(a, b) for a, b in zip(model.iter_predict("xnli", ROWS, chunk_rows=2), rows, strict=True))


@pytest.mark.parametrize("ids", [[17, 17, 3], [17, "x", 3.5]])
def test_ids_of_any_json_type_come_back_as_given(trained, tmp_path, ids):
    """Integer, mixed and odd ids (the user's own data): returned as given, repeated ones row by row."""
    rows = [{**row, "id": i} for row, i in zip(ROWS, ids)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "p.jsonl"
    argv = ["predict", "--run", str(trained), "--task", "xnli", "--input", str(tmp_path / "in.jsonl")]
    result = run_cli(*argv, "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["id"] for r in read_jsonl(out)] == ids


def test_predict_on_a_language_the_task_does_not_have_is_one_line(trained, tmp_path):
    """--language names the task's language (any of them, trained or not): one that is not -- whether the input is
    a file or a dataset folder -- is refused before anything is read or written."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    for source in (str(tmp_path / "in.jsonl"), "tasks/xnli/fixtures/xnli"):
        argv = ["predict", "--run", str(trained), "--task", "xnli", "--language", "xx", "--input", source]
        result = run_cli(*argv, "--out", str(tmp_path / "p.jsonl"))
        assert result.returncode == 2 and "--language 'xx': task 'xnli' has no such language" in result.stderr
        assert result.stderr.strip().count("\n") == 0 and not (tmp_path / "p.jsonl").exists()


def test_the_api_prints_no_library_bars(trained, capfd):
    """load_run().predict writes nothing of the datasets library's ("Map", "Flattening the indices") to the
    caller's console, and leaves its bars as they were."""
    import datasets

    from mtft.api import load_run

    model = load_run(trained)
    capfd.readouterr()
    model.predict("xnli", ROWS)
    out, err = capfd.readouterr()
    assert "Map" not in out + err and "Flattening" not in out + err
    assert not datasets.are_progress_bars_disabled()


def same(a: dict, b: dict) -> bool:
    """The same row, probabilities to float32 round-off (a row's padding differs with its batch)."""
    close = all(abs(a["probabilities"][k] - b["probabilities"][k]) < 1e-5 for k in b["probabilities"])
    return a["id"] == b["id"] and a["prediction"] == b["prediction"] and close


@pytest.mark.parametrize(
    "content, expect",
    [
        ('{"premise": "a", "hypothesis": "b"}\n{oops\n', "in.jsonl"),
        ("", "the file is empty"),
        ("  \n\t\n", "the file is empty"),
        ('{"premise": "\\ud800 lone", "hypothesis": "b"}\n', "in.jsonl"),
        (b'{"premise": "caf\xe9", "hypothesis": "b"}\n', "not UTF-8"),
        ('{"premise": "a"}\n', "missing column(s) hypothesis"),
    ],
)
def test_a_bad_predict_input_is_one_line_and_no_output(trained, tmp_path, content, expect):
    """A malformed, empty, non-UTF-8 or ill-fitting input: mtft's one line only (no datasets logger line before
    it), and no --out."""
    source = tmp_path / "in.jsonl"
    (source.write_bytes if isinstance(content, bytes) else source.write_text)(content)
    argv = ["predict", "--run", str(trained), "--task", "xnli", "--input", str(source), "--out", str(tmp_path / "p")]
    one_line_error(run_cli(*argv), expect)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_unusual_text_is_answered_row_by_row(trained, tmp_path):
    """NUL, right-to-left marks, stacked combining characters, a blank text and a 1 MB text: each row answered,
    with its id (a text longer than the model reads is truncated, as in training)."""
    odd = {
        "nul": "a\u0000b dog",
        "rtl": "\u202eevil\u202c \u0627\u0644\u0643\u0644\u0628 \u200f",
        "combining": "e\u0301\u0301\u0301\u0301",
        "blank": "   ",
        "megabyte": "word " * 200_000,
    }
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": k, "premise": v, "hypothesis": "x"}) + "\n" for k, v in odd.items()))
    out = tmp_path / "p.jsonl"
    result = run_cli("predict", "--run", str(trained), "--task", "xnli", "--input", str(source), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == list(odd)
    assert all(r["prediction"] in ("entailment", "neutral", "contradiction") for r in rows)


def outputs_case(tmp: Path, run: Path, case: str) -> tuple[list[str], str]:
    """(argv, what the one line holds) of an output case; files it needs are made here."""
    (tmp / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp / "other.txt").write_text("the user's other file\n")
    predict = ["predict", "--run", str(run), "--task", "xnli", "--input", str(tmp / "in.jsonl"), "--out"]
    if case == "predict-out-is-input":
        return [*predict, str(tmp / "in.jsonl")], "is an input of this command"
    if case == "predict-out-inside-run":
        return [*predict, str(run / "predictions.jsonl")], "is inside the run folder"
    if case == "predict-out-symlink":
        (tmp / "p.jsonl").symlink_to(tmp / "other.txt")
        return [*predict, str(tmp / "p.jsonl")], "is a symbolic link"
    if case == "predict-out-exists":
        return [*predict, str(tmp / "other.txt")], "exists; choose another name"
    if case == "predict-lock-symlink":
        (tmp / ".p.jsonl.lock").symlink_to(tmp / "other.txt")
        return [*predict, str(tmp / "p.jsonl")], "is a symbolic link"
    if case == "evaluate-out-symlink":
        (tmp / "mine").mkdir()
        (tmp / "out").symlink_to(tmp / "mine")
        return ["evaluate", "--run", str(run), "--out", str(tmp / "out")], "is a symbolic link"
    if case == "probe-out-symlink":
        (tmp / "mine").mkdir()
        (tmp / "out").symlink_to(tmp / "mine")
        return ["probe", "--checkpoint", str(run / "best"), "--gamma", "0.1", "--out", str(tmp / "out")], "symbolic"
    if case == "probe-out-inside-run":
        argv = ["probe", "--checkpoint", str(run / "best"), "--gamma", "0.1", "--out", str(run / "probe")]
        return argv, "is inside the run folder"
    if case == "export-out-is-the-run":
        return ["export", "--run", str(run), "--out", str(run)], "--out"
    if case == "export-out-inside-run-via-link":
        (tmp / "link").symlink_to(run)
        return ["export", "--run", str(run), "--out", str(tmp / "link/exported")], "is inside the run folder"
    raise KeyError(case)


OUTPUT_CASES = [
    "predict-out-is-input",
    "predict-out-inside-run",
    "predict-out-symlink",
    "predict-out-exists",
    "predict-lock-symlink",
    "evaluate-out-symlink",
    "export-out-is-the-run",
    "export-out-inside-run-via-link",
    "probe-out-symlink",
    "probe-out-inside-run",
]


@pytest.mark.parametrize("case", OUTPUT_CASES)
def test_outputs_land_only_where_the_user_pointed(trained, tmp_path, case):
    argv, expect = outputs_case(tmp_path, trained, case)
    before, run_before, names = snapshot(tmp_path), snapshot(trained), {p.name for p in tmp_path.iterdir()}
    one_line_error(run_cli(*argv), expect)
    assert snapshot(tmp_path) == before and snapshot(trained) == run_before
    assert {p.name for p in tmp_path.iterdir()} == names  # no temporary, lock or partial left beside --out


def test_predict_pins_a_checkpoint_that_rotation_removes(trained, tmp_path, monkeypatch):
    """A training run rotating its checkpoints (or replacing best/) while predict or export loads one: files open
    before the folder goes are read whole; a default checkpoint gone before it was opened is resolved again."""
    from mtft.training import restore

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    newest = _newest(run)
    real = restore._rebuild
    calls = []

    def rotate_while_loading(root, folder, files):
        calls.append(folder)
        shutil.rmtree(folder)  # the files are open: the rebuild still reads them
        return real(root, folder, files)

    monkeypatch.setattr(restore, "_rebuild", rotate_while_loading)
    loaded = restore.load_run(run, "latest")
    assert loaded.checkpoint == newest and not newest.exists()
    # the checkpoint resolved by default vanished before its files were opened: the next resolution is used
    shutil.copytree(trained, tmp_path / "run2")
    run2 = tmp_path / "run2"
    real_pinned, gone = restore._pinned, []

    def rotated_before_open(root, folder):
        if not gone:
            gone.append(folder)
            shutil.rmtree(folder)
        return real_pinned(root, folder)

    monkeypatch.setattr(restore, "_rebuild", real)
    monkeypatch.setattr(restore, "_pinned", rotated_before_open)
    loaded = restore.load_run(run2)  # best/ first; gone, then the newest checkpoint
    assert gone == [run2 / "best"] and loaded.checkpoint == _newest(run2)
    # a checkpoint named by the user that vanished is one line, not a FileNotFoundError
    gone.clear()
    shutil.copytree(trained, tmp_path / "run3")
    from mtft.core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="was removed while it was being loaded"):
        restore.load_run(tmp_path / "run3", _newest(tmp_path / "run3").name)


def python() -> str:
    """The ``python`` of a command the test starts itself and runs beside others: the warm Python's client
    (tests/helpers/warm_client.py), which has the command forked warm, ends as it ended and, killed, takes it
    with it -- no interpreter start-up and teardown per process; a fresh interpreter with ``MTFT_TESTS_COLD=1``."""
    if WARM.folder is None:
        return sys.executable
    if WARM.server is None or WARM.server.poll() is not None:
        WARM.start()  # the server writes the client
    return WARM.paths()[1]


@pytest.mark.timeout(600)
def test_two_evaluations_into_one_out_leave_one_whole(trained, tmp_path):
    """Two ``run.py evaluate`` into the same new --out at once: one writes it whole (exit 0), the other is refused
    in one line (exit 2) -- by the lock while the first writes, or because --out is no longer empty."""
    out = tmp_path / "evaluation"
    argv = [python(), "run.py", "evaluate", "--run", str(trained), "--out", str(out)]
    env = clean_env(OMP_NUM_THREADS="1")
    processes = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=PIPE, stderr=PIPE, text=True) for _ in range(2)]
    results = [(p.wait(300), *p.communicate()) for p in processes]
    assert sorted(code for code, _, _ in results) == [0, 2], results
    refused = next(err for code, _, err in results if code == 2).strip()
    assert refused.count("\n") == 0 and refused.startswith("error: --out"), refused
    assert ("being written by another mtft command" in refused) or ("exists and is not empty" in refused)
    best = json.loads((trained / "best/metrics.json").read_text())
    assert json.loads((out / "metrics.json").read_text())["step"] == best["step"]  # the winner's, whole
    assert {"COMPLETE", "metrics.json", "report.md", "config.yaml", "predictions"} <= {p.name for p in out.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evaluation"]  # no partial, no lock left


@pytest.mark.timeout(600)
def test_loading_latest_while_training_rotates_checkpoints_never_fails(tmp_path):
    """A training run saving a checkpoint every step and keeping one (so every step deletes the one before), and
    meanwhile the run loaded again and again as ``predict --checkpoint latest`` and ``export`` load it: each load
    succeeds (pinned files, or the next checkpoint when one vanished first)."""
    from mtft.training.checkpoint import latest_checkpoint
    from mtft.training.restore import load_run

    run = tmp_path / "run"
    extra = {
        "data.tasks": "[{name: xnli, languages: [en], protocol: in_language, max_train_examples: 64}]",
        "evaluation.every_steps": None,
        "evaluation.metric_for_best": None,
        "checkpointing.every_steps": 1,
        "checkpointing.keep_last": 1,
    }
    argv = [python(), "run.py", "--config", BASE_CONFIG, *base_overrides(run, 40, **extra)]
    training = subprocess.Popen(argv, cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"), stdout=PIPE, stderr=PIPE)
    loads, steps = 0, set()
    try:
        while training.poll() is None:
            if latest_checkpoint(run) is None:  # not "step-*": the first one's step-N.partial matches that too
                time.sleep(0.1)
                continue
            loaded = load_run(run, "latest")
            loads += 1
            steps.add(loaded.checkpoint.name)
    finally:
        _, err = training.communicate(timeout=300)
    assert training.returncode == 0, err[-3000:]
    assert loads >= 3 and len(steps) >= 2, (loads, steps)


def test_predict_evaluate_and_export_default_to_the_same_checkpoint(trained, tmp_path):
    """One default for every command (best/ where the run kept one): a default export predicts what a default
    predict does."""
    from mtft.api import load_run
    from mtft.commands.export import export_run

    assert load_run(trained).loaded.checkpoint == trained / "best"
    export_run(trained, tmp_path / "export")
    assert json.loads((tmp_path / "export/export.json").read_text())["checkpoint"] == str((trained / "best").resolve())
    evaluation = tmp_path / "evaluation"
    assert run_cli("evaluate", "--run", str(trained), "--out", str(evaluation)).returncode == 0
    best = json.loads((trained / "best/metrics.json").read_text())
    assert json.loads((evaluation / "metrics.json").read_text())["step"] == best["step"] != 4  # not the newest
