"""A hostile user's inputs, table-driven: each ends in one error line (exit 2), never a traceback, never a long
message, and leaves no file behind (no run directory, no half-written output, nothing replaced, no folder of the
user's deleted).

Cases that fail before any training starts run in one helper process (``helpers/run_cases.py``: ``run.py``'s own
``__main__`` block per case, torch imported once); none of them may start DeepSpeed. Cases that get as far as
loading data or task plug-ins run as their own ``python run.py`` process; those a run can refuse from the config,
the task files and the files' bytes alone (:data:`PREFLIGHT`) must print nothing but their error line -- no line
of DeepSpeed's, no data loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.launch import REPO, clean_env, run_cli
from tests.helpers.runs import BASE_CONFIG

BASE = ["--config", BASE_CONFIG]
SENTIMENT = json.dumps(
    {
        "task": "sent",
        "languages": ["en"],
        "default_protocol": "in_language",
        "text_columns": ["text"],
        "label_names": ["neg", "pos"],
        "metrics": ["accuracy"],
        "data": {
            "train": {"path": "my/sent", "name": "{language}", "split": "train"},
            "validation": {"path": "my/sent", "name": "{language}", "split": "validation"},
        },
    }
)
GOOD_ROWS = "".join(json.dumps({"text": f"good {i}", "label": ["neg", "pos"][i % 2]}) + "\n" for i in range(8))
# a one-cell study of the e2e base config, its file at {tmp}/s.yaml
STUDY = ["study", "--config", "{tmp}/s.yaml"]
STUDY_FILE = f"name: s\nbase: {REPO / BASE_CONFIG}\nseeds: [0]\n"
# the user task above, its data from {tmp}/data/en/<split>.jsonl
SENT_RUN = [
    *BASE,
    "run.output_dir={tmp}/run",
    "training.max_steps=2",
    "evaluation.metric_for_best=null",
    "data.task_dirs=[{tmp}/tasks]",
    "data.tasks=[{name: sent, languages: [en]}]",
    "data.sources.my/sent={tmp}/data/{{name}}/{{split}}.jsonl",
]
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nweighting: {options: {foo: *b}}\n"
# a run folder as far as predict and evaluate read it before loading a model: its config
RUN_OF_XNLI = "data:\n  tasks: [{name: xnli}]\n"
PREMISES = '{"premise": "a dog sleeps"}\n'
FOREIGN = {"keep/config.yaml": "mine: true\n", "keep/precious.txt": "do not delete\n"}

# id: (argv, files to create under {tmp} first, a fragment the error line must hold)
FAST = {
    "config-missing": (["--config", "{tmp}/none.yaml"], {}, "config file not found"),
    "config-is-dir": (["--config", "{tmp}"], {}, "is a directory"),
    "config-not-utf8": (["--config", "{tmp}/c.yaml"], {"c.yaml": b"run:\n  name: \xff\xfe\n"}, "not UTF-8"),
    "config-empty": (["--config", "{tmp}/c.yaml"], {"c.yaml": ""}, "empty"),
    "config-a-list": (["--config", "{tmp}/c.yaml"], {"c.yaml": "- 1\n- 2\n"}, "must be a mapping"),
    "config-malformed": (["--config", "{tmp}/c.yaml"], {"c.yaml": "run: [1,\n"}, "malformed YAML"),
    "config-alias-bomb": (["--config", "{tmp}/c.yaml"], {"c.yaml": ALIAS_BOMB}, "aliases"),
    "unknown-key": ([*BASE, "colour=blue"], {}, "unknown key 'colour'"),
    "leave-out-count-and-fraction": (
        [*BASE, "data.leave_out={count: 1, fraction: 0.1}"],
        {},
        "data.leave_out: give exactly one of count: N and fraction: F",
    ),
    "unknown-nested-key": ([*BASE, "training.colour=blue"], {}, "unknown key 'training.colour'"),
    "wrong-type": ([*BASE, "training.max_steps=abc"], {}, "training.max_steps"),
    "out-of-range": ([*BASE, "training.max_steps=0"], {}, "training.max_steps"),
    "lr-inf": ([*BASE, "training.optimizer.lr=.inf"], {}, "finite"),
    "lr-nan": ([*BASE, "training.optimizer.lr=.nan"], {}, "finite"),
    "override-no-equals": ([*BASE, "training.max_steps"], {}, "bad override"),
    "override-bad-index": ([*BASE, "data.tasks.5.name=x"], {}, "is not an index"),
    "override-alias": ([*BASE, "weighting.options=&a {x: *a}"], {}, "weighting"),
    "unknown-command": (["frobnicate"], {}, "unknown command 'frobnicate'"),
    "no-config": ([], {}, "--config"),
    "language-dotdot": ([*BASE, "data.tasks.0.languages=[../../../../x]"], {}, "not a valid name"),
    "language-absolute": ([*BASE, "data.tasks.0.languages=[/tmp/x]"], {}, "not a valid name"),
    "task-absolute": ([*BASE, "data.tasks.0.name=/tmp/x"], {}, "not a valid name"),
    "task-dotdot": ([*BASE, "data.tasks.0.name=../x"], {}, "not a valid name"),
    "task-name-dots": ([*BASE, "data.tasks.0.name=a..b"], {}, "not a valid name"),
    "no-tasks": ([*BASE, "data.tasks=[]"], {}, "data.tasks"),
    "duplicate-language": ([*BASE, "data.tasks.0.languages=[en,en]"], {}, "twice"),
    "unknown-weighting": ([*BASE, "weighting.method=nope"], {}, "weighting"),
    "weighting-huge-option": ([*BASE, "weighting.options={solver: " + "x" * 5000 + "}"], {}, "characters"),
    "weighting-option-of-another": (
        [*BASE, "weighting.method=mean", "weighting.options.floor=0.3"],
        {},
        "'floor' is not an option of weighting 'mean' (an option of lfmlf, mgda_normalized)",
    ),
    "unknown-adapter": ([*BASE, "model.adapter.method=nope"], {}, "model.adapter.method"),
    "adapter-option-of-another": (
        [*BASE, "weighting.method=mean", "model.adapter.method=lora", "model.adapter.init_a=gaussian"],
        {},
        "model.adapter: 'init_a' is not an option of adapter method 'lora' (an option of multi_lora)",
    ),
    "eval-split": ([*BASE, "evaluation.split=train"], {}, "evaluation.split"),
    "deepspeed-missing": ([*BASE, "training.deepspeed_config={tmp}/none.json"], {}, "not found"),
    "deepspeed-bad-json": ([*BASE, "training.deepspeed_config={tmp}/ds.json"], {"ds.json": "{nope"}, "ds.json"),
    "print-config-bad": ([*BASE, "--print-config", "colour=1"], {}, "unknown key"),
    "overwrite-foreign": (
        [*BASE, "run.output_dir={tmp}/keep", "run.overwrite=true"],
        FOREIGN,
        "not an mtft run directory",
    ),
    "output-dir-is-file": ([*BASE, "run.output_dir={tmp}/f"], {"f": "x"}, "is a file"),
    "resume-foreign": ([*BASE, "run.output_dir={tmp}/keep", "--resume"], FOREIGN, "cannot resume"),
    "score-no-task": (["score", "--predictions", "x"], {}, "--task"),
    "score-missing-predictions": (
        ["score", "--task", "xnli/en", "--predictions", "{tmp}/none.jsonl"],
        {},
        "not found",
    ),
    "score-predictions-dir": (["score", "--task", "xnli/en", "--predictions", "{tmp}"], {}, "is a directory"),
    "score-predictions-not-utf8": (
        ["score", "--task", "xnli/en", "--predictions", "{tmp}/p.jsonl"],
        {"p.jsonl": b'{"id": "\xff", "prediction": "x"}\n'},
        "not UTF-8",
    ),
    "score-predictions-empty": (
        ["score", "--task", "xnli/en", "--predictions", "{tmp}/p.jsonl"],
        {"p.jsonl": ""},
        "the predictions file is empty",
    ),
    "score-predictions-malformed": (
        ["score", "--task", "xnli/en", "--predictions", "{tmp}/p.jsonl"],
        {"p.jsonl": "{oops\n"},
        "not a JSON object",
    ),
    "score-bad-setting-yaml": (
        ["score", "--task", "xnli/en", "--predictions", "x", "--setting", "a=[1,"],
        {},
        "--setting",
    ),
    "score-setting-no-equals": (
        ["score", "--task", "xnli/en", "--predictions", "x", "--setting", "a"],
        {},
        "KEY=VALUE",
    ),
    "score-unknown-task": (["score", "--task", "nope/en", "--predictions", "x"], {}, "unknown task 'nope'"),
    "score-unknown-language": (["score", "--task", "xnli/xx", "--predictions", "x"], {}, "no language 'xx'"),
    "export-not-a-run": (["export", "--run", "{tmp}/keep", "--out", "{tmp}/out"], FOREIGN, "keep"),
    "export-out-foreign": (["export", "--run", "{tmp}/run", "--out", "{tmp}/keep"], FOREIGN, "not empty"),
    "export-no-out": (["export", "--run", "{tmp}"], {}, "--out"),
    "export-out-in-run": (  # would be read as the run's newest checkpoint
        ["export", "--run", "{tmp}/run", "--out", "{tmp}/run/checkpoints/step-00000009"],
        {"run/config.yaml": "run: {}\n"},
        "is inside the run folder",
    ),
    "export-partial-foreign": (
        ["export", "--run", "{tmp}/run", "--out", "{tmp}/out"],
        {"out.partial/precious.txt": "do not delete\n"},
        "out.partial exists and was not written by mtft; move it away",
    ),
    "run-partial-foreign": (
        [*BASE, "run.output_dir={tmp}/run"],
        {"run.partial/precious.txt": "do not delete\n"},
        "run.partial exists and was not written by mtft",
    ),
    "run-previous-foreign": (
        [*BASE, "run.output_dir={tmp}/run"],
        {"run.previous/COMPLETE": "mine\n"},
        "run.previous exists and was not written by mtft",
    ),
    "unknown-language": ([*BASE, "data.tasks.0.languages=[en,xx]"], {}, "has no language(s) xx"),
    "bad-task-setting": ([*BASE, "data.tasks.0.settings={colour: 1}"], {}, "settings.colour"),
    # source and target languages (issue 29)
    "source-unknown": ([*BASE, "data.tasks.0.source_languages=[en,xx]"], {}, "source_languages has no language(s) xx"),
    "source-not-evaluated": (
        [*BASE, "data.tasks.0.languages=[en,ar]", "data.tasks.0.source_languages=[en,de]"],
        {},
        "source language(s) de not in its languages [en, ar]",
    ),
    "sources-empty": ([*BASE, "data.tasks.0.source_languages=[]"], {}, "must list at least one language"),
    "source-twice": ([*BASE, "data.tasks.0.source_languages=[en,de,en]"], {}, "lists a language twice"),
    "source-without-its-training-data": (
        [*BASE, "data.tasks.0.protocol=zero_shot", "data.tasks.0.source_languages=[en,de]"],
        {},
        "source language 'de' has no training data under protocol 'zero_shot'",
    ),
    "target-without-evaluation-split": (
        [
            *BASE,
            "data.tasks=[{name: tydiqa, languages: [en, sw], source_languages: [en]}]",
            "evaluation.split=test",
            "evaluation.metric_for_best=null",
        ],
        {},
        "task 'tydiqa' has no 'test' split to evaluate its target language(s) sw on",
    ),
    "select-on-a-target": (
        [*BASE, "data.tasks.0.source_languages=[en,de]", "evaluation.metric_for_best=xnli/ar/accuracy"],
        {},
        "reads 'ar', a target language of task 'xnli', and evaluation.select_on=source",
    ),
    "early-stopping-without-metric": (
        [*BASE, "evaluation.metric_for_best=null", "evaluation.early_stopping_patience=2"],
        {},
        "set evaluation.metric_for_best and evaluation.every_steps",
    ),
    "early-stopping-patience-zero": ([*BASE, "evaluation.early_stopping_patience=0"], {}, "early_stopping_patience"),
    "metric-for-best-unknown": ([*BASE, "evaluation.metric_for_best=xnli/f1"], {}, "not a metric of this run"),
    "optimizer-metric-under-zero3": (
        [*BASE, "training.deepspeed_config=configs/deepspeed/zero3.json", "gradients.metric=optimizer"],
        {},
        "gradients.metric=optimizer reads AdamW's state, which ZeRO-3 partitions",
    ),
    "regularization-under-zero3": (
        [
            *BASE,
            "training.deepspeed_config=configs/deepspeed/zero3.json",
            "forgetting.enabled=true",
            "forgetting.regularization=0.1",
        ],
        {},
        "forgetting.regularization adds λ(θ − θ_p) to each weight's gradient through a hook",
    ),
    "budget-scale-under-zero2": (
        [
            *BASE,
            "training.deepspeed_config=configs/deepspeed/zero2.json",
            "forgetting.enabled=true",
            "forgetting.budget={value: 0.5, action: scale}",
        ],
        {},
        "forgetting.budget.action=scale edits the weights the optimizer steps",
    ),
    "retrieval-one-language": (
        [*BASE, "forgetting.enabled=true", "forgetting.retrieval.enabled=true", "corpus.languages=[en]"],
        {},
        "forgetting.retrieval: needs two languages",
    ),
    "retrieval-bad-pair": (
        [*BASE, "forgetting.enabled=true", "forgetting.retrieval={enabled: true, pairs: [en_de]}"],
        {},
        "forgetting.retrieval.pairs: 'en_de' is not 'source-target'",
    ),
    "retrieval-no-folder": (
        [*BASE, "forgetting.enabled=true", "forgetting.retrieval={enabled: true, path: {tmp}/bitext}"],
        {},
        "forgetting.retrieval.path: no such folder",
    ),
    "retrieval-name-layout": ([*BASE, "forgetting.retrieval.name=tatoeba"], {}, "must contain '{language}'"),
    "template-width-spec": (
        [*BASE, "forgetting.retrieval.name='{{language:>999999999}}'"],
        {},
        "forgetting.retrieval.name: {language:...}: a format spec is not allowed",
    ),
    "template-unknown-field": (
        [*BASE, "data.sources.x/y={tmp}/{{nope}}.jsonl"],
        {},
        "data.sources: ['x/y']: unknown placeholder {nope}; allowed placeholders: {name}, {split}",
    ),
    "backbone-no-folder": ([*BASE, "model.backbone={tmp}/model"], {}, "no such folder"),
    "backbone-no-config-json": (
        [*BASE, "model.backbone={tmp}/model"],
        {"model/weights.bin": "x"},
        "the folder has no config.json",
    ),
    "backbone-hub-id-offline": (
        [*BASE, "model.backbone=nobody/no-such-model"],
        {},
        "not in the Hugging Face cache while the Hub is offline",
    ),
    # using a finished run (issue 31): refused from the run's config.yaml and the input's columns, before any model
    "predict-not-a-run": (
        ["predict", "--run", "{tmp}/keep", "--task", "xnli", "--input", "{tmp}/in.jsonl", "--out", "{tmp}/p.jsonl"],
        FOREIGN,
        "keep/config.yaml: ",
    ),
    "predict-unknown-task": (
        ["predict", "--run", "{tmp}/run", "--task", "nli", "--input", "{tmp}/in.jsonl", "--out", "{tmp}/p.jsonl"],
        {"run/config.yaml": RUN_OF_XNLI, "in.jsonl": PREMISES},
        "task 'nli' is not a task of this run; its tasks: xnli",
    ),
    "predict-missing-columns": (
        ["predict", "--run", "{tmp}/run", "--task", "xnli", "--input", "{tmp}/in.jsonl", "--out", "{tmp}/p.jsonl"],
        {"run/config.yaml": RUN_OF_XNLI, "in.jsonl": PREMISES},
        "in.jsonl: missing column(s) hypothesis needed by task 'xnli' (sequence_classification: reads premise, "
        "hypothesis); it has: premise",
    ),
    "predict-no-input": (["predict", "--run", "{tmp}", "--task", "xnli", "--out", "{tmp}/p.jsonl"], {}, "--input"),
    "evaluate-not-a-run": (["evaluate", "--run", "{tmp}/keep", "--out", "{tmp}/out"], FOREIGN, "keep/config.yaml: "),
    "evaluate-trained-key": (
        ["evaluate", "--run", "{tmp}/run", "--out", "{tmp}/out", "model.adapter.method=lora"],
        {"run/config.yaml": RUN_OF_XNLI},
        "run.py evaluate takes data.* and evaluation.* overrides (what is evaluated); other keys describe what was",
    ),
    "evaluate-bad-override": (
        # a language the task file does not declare is evaluated (a target); one that is no name is refused
        ["evaluate", "--run", "{tmp}/run", "--out", "{tmp}/out", "data.tasks.0.languages=[en,../xx]"],
        {"run/config.yaml": RUN_OF_XNLI},
        "'../xx' is not a valid name",
    ),
    "evaluate-out-in-run": (
        ["evaluate", "--run", "{tmp}/run", "--out", "{tmp}/run/evaluation"],
        {"run/config.yaml": RUN_OF_XNLI},
        "is inside the run folder",
    ),
    "probe-bad-gamma": (["probe", "--checkpoint", "{tmp}", "--gamma", "abc"], {}, "--gamma"),
    "probe-no-gamma": (["probe", "--checkpoint", "{tmp}"], {}, "--gamma"),
    # studies (issue 28): refused while planning or claiming the folder, before any run or file
    "study-output-dir-a-file": ([*STUDY, "output_dir={tmp}/out"], {"s.yaml": STUDY_FILE, "out": "x"}, "is a file"),
    "study-owns-run-output-dir": (
        [*STUDY, "output_dir={tmp}/out", "overrides.run.output_dir={tmp}/escaped"],
        {"s.yaml": STUDY_FILE},
        "'run.output_dir' is set by the study itself",
    ),
    "study-report-only-foreign-folder": (
        [*STUDY, "output_dir={tmp}/out", "--report-only"],
        {"s.yaml": STUDY_FILE, "out/study.md": "mine", "out/results.csv": "mine"},
        "is not a study directory",
    ),
}

# cases that load task files or data: their own process each
SLOW = {
    "unknown-task": ([*BASE, "run.output_dir={tmp}/run", "data.tasks.0.name=nli"], {}, "unknown task 'nli'"),
    "task-dir-missing": ([*SENT_RUN[:-2], "data.task_dirs=[{tmp}/none]"], {}, "task folder not found"),
    "task-file-alias": (SENT_RUN, {"tasks/sent.yaml": "task: &t sent\nlanguages: [*t]\n"}, "aliases"),
    "task-file-bad-language": (SENT_RUN, {"tasks/sent.yaml": SENTIMENT.replace('["en"]', '["../x"]')}, "valid name"),
    "plugin-raises": (
        SENT_RUN,
        {
            "tasks/sent.yaml": SENTIMENT.replace('"task"', '"class": "boom:Boom", "task"'),
            "tasks/boom.py": "raise RuntimeError('plug-in bug')\n",
        },
        "sent.yaml",
    ),
    "data-empty": (SENT_RUN, {"tasks/sent.yaml": SENTIMENT, "data/en/train.jsonl": ""}, "empty"),
    "data-malformed": (
        SENT_RUN,
        {"tasks/sent.yaml": SENTIMENT, "data/en/train.jsonl": GOOD_ROWS + "{oops\n"},
        "train.jsonl",
    ),
    "data-text-not-string": (
        SENT_RUN,
        {"tasks/sent.yaml": SENTIMENT, "data/en/train.jsonl": '{"text": 5, "label": "pos"}\n' * 4},
        "not text",
    ),
    "data-missing-file": (SENT_RUN, {"tasks/sent.yaml": SENTIMENT}, "dataset file not found"),
    "data-leave-out-all": (
        [*SENT_RUN, "data.leave_out={count: 8}"],
        {"tasks/sent.yaml": SENTIMENT, "data/en/train.jsonl": GOOD_ROWS},
        "data.leave_out count=8 removes 8 of 8 example(s); at least 1 must go and 1 remain",
    ),
    "mmr-without-classification": (
        [
            *BASE,
            "run.output_dir={tmp}/run",
            "data.tasks=[{name: wikiann, languages: [en], protocol: in_language}]",
            "data.sources.unimelb-nlp/wikiann=tasks/wikiann/fixtures/wikiann",
            "evaluation.metric_for_best=null",
            "stability.mmr=0.5",
        ],
        {},
        "stability.mmr=0.5 regularises the class centres of classification heads",
    ),
    "forgetting-no-masked-token": (
        [
            *BASE,
            "run.output_dir={tmp}/run",
            "forgetting.enabled=true",
            "corpus.languages=[en,de]",
            "forgetting.prediction_examples=2",
        ],
        {},
        "forgetting.prediction_examples=2: the first 2 held-out text(s) of corpus language 'de' hold no masked token",
    ),
    "data-not-utf8": (
        SENT_RUN,
        {"tasks/sent.yaml": SENTIMENT, "data/en/train.jsonl": GOOD_ROWS.encode() + b'{"text": "caf\xe9"}\n'},
        "train.jsonl (for my/sent (config en) split train): not UTF-8 text (byte 293, line 9)",
    ),
}
# refused before the process group and DeepSpeed start, before any data is loaded (mtft.training.preflight)
PREFLIGHT = {
    "unknown-task",
    "task-dir-missing",
    "task-file-alias",
    "task-file-bad-language",
    "plugin-raises",
    "data-empty",
    "data-missing-file",
    "data-not-utf8",
    "mmr-without-classification",
}
# print nothing but their error line: the preflight's, and (after DeepSpeed's line on starting the process group)
# a malformed line of a data file, which the datasets library logs itself unless load_split silences it
ONE_LINE = PREFLIGHT | {"data-malformed"}


def prepare(root: Path, case: str, files: dict) -> Path:
    tmp = root / case
    tmp.mkdir()
    for name, content in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return tmp


def expand(argv: list[str], tmp: Path) -> list[str]:
    return [arg.replace("{tmp}", str(tmp)).replace("{{", "{").replace("}}", "}") for arg in argv]


def listing(*roots: Path) -> set[str]:
    return {str(p) for root in roots if root.exists() for p in root.rglob("*")}


def check(case: str, code: int, output: str, new: list[str], expect: str) -> None:
    assert code == 2, f"{case}: exit {code}\n{output[-3000:]}"
    assert "Traceback" not in output, f"{case}:\n{output[-3000:]}"
    assert len(output) <= 2000, f"{case}: {len(output)} characters of output"
    assert expect in output, f"{case}: {expect!r} not in\n{output}"
    assert not new, f"{case} left files behind: {new}"


@pytest.fixture(scope="module")
def fast_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    cases, snapshots = [], {}
    for case, (argv, files, _) in FAST.items():
        tmp = prepare(root, case, files)
        snapshots[case] = {p: Path(p).read_bytes() for p in listing(tmp) if Path(p).is_file()}
        cases.append({"id": case, "argv": expand(argv, tmp), "watch": [str(tmp), str(REPO / "runs")]})
    (root / "cases.json").write_text(json.dumps(cases))
    top_level = sorted(p.name for p in REPO.iterdir())  # nothing appears beside run.py either
    subprocess.run(
        [sys.executable, str(REPO / "tests/helpers/run_cases.py"), root / "cases.json", root / "results.json"],
        cwd=REPO,
        env=clean_env(OMP_NUM_THREADS="1"),
        check=True,
        timeout=900,
    )
    assert sorted(p.name for p in REPO.iterdir()) == top_level
    return json.loads((root / "results.json").read_text()), snapshots, root


def test_the_table_is_large_enough():
    assert len(FAST) + len(SLOW) >= 40 and PREFLIGHT <= set(SLOW)


@pytest.mark.parametrize("case", sorted(FAST))
def test_fails_in_one_line_and_writes_nothing(case, fast_results):
    results, snapshots, root = fast_results
    result = results[case]
    check(case, result["code"], result["output"], result["new"], FAST[case][2])
    assert not result["deepspeed"], f"{case}: DeepSpeed was started (by this case, or an earlier one)"
    tmp = root / case  # what was there is there, byte for byte (a foreign folder survives overwrite=true)
    assert {p: Path(p).read_bytes() for p in listing(tmp) if Path(p).is_file()} == snapshots[case]


@pytest.mark.parametrize("case", sorted(SLOW))
def test_data_and_task_file_errors_fail_in_one_line(case, tmp_path):
    argv, files, expect = SLOW[case]
    tmp = prepare(tmp_path, case, files)
    if case.startswith("data-") and case != "data-missing-file":
        (tmp / "data/en/validation.jsonl").write_text(GOOD_ROWS)
    # every case here writes its run into tmp (run.output_dir={tmp}/run); the repository's runs/ is not watched: the
    # fast cases, which use base.yaml's runs/e2e, take and drop its lock file there while this test runs beside them
    assert any(arg.startswith("run.output_dir={tmp}") for arg in argv), case
    before = listing(tmp)
    result = run_cli(*expand(argv, tmp), threads=1)
    new = sorted(listing(tmp) - before)
    output = result.stdout + result.stderr
    check(case, result.returncode, output, new, expect)
    if case in ONE_LINE:
        lines = [line for line in output.strip().splitlines() if not line.startswith("DeepSpeed ")]
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{case}:\n{output}"
        assert case not in PREFLIGHT or output.startswith("error: "), f"{case}:\n{output}"
    if case in PREFLIGHT:
        assert "deepspeed" not in output.lower() and "torch.distributed" not in output, output
