"""``run.py score``: metrics of a predictions file against the references, and one clear error for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtft.commands import score as score_command
from mtft.core.errors import ConfigError, DataError
from tests.helpers.launch import REPO, run_cli
from tests.helpers.runs import read_jsonl
from tests.helpers.tasks import write_tydiqa_copy

WIKIANN = str(REPO / "tasks/wikiann/fixtures/wikiann")
TYDIQA = str(REPO / "tasks/tydiqa/fixtures/tydiqa")
TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]


def gold_ner() -> list[dict]:
    rows = read_jsonl(REPO / "tasks/wikiann/fixtures/wikiann/en/validation.jsonl")
    return [{"id": str(i), "prediction": [TAGS[t] for t in r["ner_tags"]]} for i, r in enumerate(rows)]


def write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def parse(*argv: str):
    return score_command.build_parser().parse_args(list(argv))


def run(capsys, *argv: str) -> dict:
    assert score_command.main(parse(*argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_gold_predictions_score_perfectly_and_one_wrong_entity_by_hand(tmp_path, capsys):
    rows = gold_ner()
    result = run(
        capsys,
        "--task",
        "wikiann/en",
        "--references",
        WIKIANN,
        "--predictions",
        str(write_lines(tmp_path / "p.jsonl", rows)),
    )
    assert (result["f1"], result["precision"], result["recall"], result["examples"]) == (1.0, 1.0, 1.0, 40)
    assert "default mode" in result["metric_variant"] and result["language"] == "en"
    entities = sum(t.startswith("B-") for r in rows for t in r["prediction"])
    wrong = next(i for i, r in enumerate(rows) if "B-PER" in r["prediction"])
    rows[wrong]["prediction"] = [
        "B-LOC" if t == "B-PER" else "I-LOC" if t == "I-PER" else t for t in rows[wrong]["prediction"]
    ]
    changed = sum(t == "B-LOC" for t in rows[wrong]["prediction"]) - sum(
        t == "B-LOC" for t in gold_ner()[wrong]["prediction"]
    )
    result = run(
        capsys,
        "--task",
        "wikiann/en",
        "--references",
        WIKIANN,
        "--predictions",
        str(write_lines(tmp_path / "p.jsonl", rows)),
    )
    assert result["f1"] == pytest.approx((entities - changed) / entities)


def test_integer_ids_as_predict_gives_them_back_score_as_their_strings(tmp_path, capsys):
    rows = [{**row, "id": int(row["id"])} for row in gold_ner()]
    path = str(write_lines(tmp_path / "p.jsonl", rows))
    result = run(capsys, "--task", "wikiann/en", "--references", WIKIANN, "--predictions", path)
    assert (result["f1"], result["examples"]) == (1.0, 40)


def test_qa_answer_texts_score_with_squad_rules(tmp_path, capsys):
    rows = read_jsonl(REPO / "tasks/tydiqa/fixtures/tydiqa/secondary_task/validation.jsonl")
    swahili = [r for r in rows if r["id"].startswith("swahili-")]
    predictions = [{"id": r["id"], "prediction": r["answers"]["text"][-1].upper() + "."} for r in swahili]
    predictions[0]["prediction"] = "something else"
    result = run(
        capsys,
        "--task",
        "tydiqa/sw",
        "--references",
        TYDIQA,
        "--predictions",
        str(write_lines(tmp_path / "p.jsonl", predictions)),
    )
    assert result["exact_match"] == pytest.approx(29 / 30) and result["f1"] == pytest.approx(29 / 30)


def bad(tmp_path, rows, *extra):
    path = write_lines(tmp_path / "bad.jsonl", rows)
    return parse("--task", "wikiann/en", "--references", WIKIANN, "--predictions", str(path), *extra), path


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r[:-1], r"task 'wikiann': no prediction for 1 of 40 example id\(s\): '39'"),
        (lambda r: r[:2] + [r[1]] + r[3:], r"row 3: task 'wikiann': duplicate id '1' \(first on row 2\)"),
        (lambda r: r + [{"id": "999", "prediction": ["O"]}], r"row 41: task 'wikiann': unknown example id '999'"),
        (lambda r: r[:1] + ['{"id": "1", "prediction": '] + r[2:], r"row 2: task 'wikiann': not a JSON object"),
        (
            lambda r: r[:1] + [{"id": "1", "pred": []}] + r[2:],
            r"row 2: task 'wikiann': expected an object with exactly the keys \"id\" and \"prediction\", "
            r"got \['id', 'pred'\]",
        ),
        (
            lambda r: r[:1] + [{"id": 1.5, "prediction": []}] + r[2:],
            r"row 2: task 'wikiann': the id must be a string or an integer, got 1.5",
        ),
        (
            lambda r: r[:1] + [{**r[1], "prediction": r[1]["prediction"][:-1]}] + r[2:],
            r"row 2: task 'wikiann': example '1': \d+ tags for \d+ words",
        ),
        (
            lambda r: r[:1] + [{**r[1], "prediction": ["B-MISC"] * len(r[1]["prediction"])}] + r[2:],
            r"row 2: task 'wikiann': example '1': tag 'B-MISC' is not a label name; valid: O, B-PER",
        ),
        (lambda r: [], r"task 'wikiann': the predictions file is empty"),
    ],
)
def test_bad_predictions_name_task_file_and_row(tmp_path, mutate, message):
    args, path = bad(tmp_path, mutate(gold_ner()))
    with pytest.raises(DataError, match=message) as info:
        score_command.main(args)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "task, extra, error, message",
    [
        ("wikiannn/en", [], ConfigError, r"unknown task 'wikiannn'; available tasks: .*wikiann"),
        ("wikiann/xx", [], ConfigError, r"task 'wikiann' has no language 'xx'; valid: ar, he"),
        ("wikiann", [], ConfigError, r"--task wikiann: name the language as wikiann/<language>"),
        (
            "wikiann/en",
            ["--split", "dev"],
            ConfigError,
            r"task 'wikiann' has no split 'dev'; valid: train, validation, test",
        ),
        ("wikiann/en", ["--setting", "mode=strict"], ConfigError, r"settings.mode: Extra inputs are not permitted"),
    ],
)
def test_bad_task_language_split_or_setting(tmp_path, task, extra, error, message):
    path = write_lines(tmp_path / "p.jsonl", gold_ner())
    with pytest.raises(error, match=message):
        score_command.main(parse("--task", task, "--references", WIKIANN, "--predictions", str(path), *extra))


def test_missing_files_and_mismatched_reference_offsets(tmp_path):
    with pytest.raises(DataError, match="predictions file not found: /nonexistent.jsonl"):
        score_command.main(parse("--task", "wikiann/en", "--predictions", "/nonexistent.jsonl"))
    path = write_lines(tmp_path / "p.jsonl", gold_ner())
    with pytest.raises(DataError, match="--references /nonexistent: no such folder or file"):
        score_command.main(parse("--task", "wikiann/en", "--references", "/nonexistent", "--predictions", str(path)))

    def shift(rows):
        rows[0]["answers"]["answer_start"][0] += 2

    folder = write_tydiqa_copy(tmp_path, shift)
    rows = read_jsonl(folder / "secondary_task/validation.jsonl")
    english = [{"id": r["id"], "prediction": r["answers"]["text"][0]} for r in rows if r["id"].startswith("english-")]
    predictions = write_lines(tmp_path / "qa.jsonl", english)
    with pytest.raises(
        DataError,
        match=r"language en: task 'tydiqa': 1 of 30 row\(s\) have answers that do not match "
        r"their context: rows \d+ \(id english-",
    ):
        score_command.main(
            parse(
                "--task",
                "tydiqa/en",
                "--references",
                str(folder),
                "--predictions",
                str(predictions),
                "--setting",
                "offset_mismatch=fail",
            )
        )
    # the default (as in training) drops that row with a warning: its prediction is then an unknown id
    with pytest.raises(DataError, match=rf"qa.jsonl: row 1: task 'tydiqa': unknown example id '{english[0]['id']}'"):
        score_command.main(parse("--task", "tydiqa/en", "--references", str(folder), "--predictions", str(predictions)))


def test_cli_prints_one_error_line_and_exits_2(tmp_path):
    rows = gold_ner()
    path = write_lines(tmp_path / "p.jsonl", rows + [rows[0]])
    result = run_cli("score", "--task", "wikiann/en", "--references", WIKIANN, "--predictions", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {path}: row 41: task 'wikiann': duplicate id '0' (first on row 1)"
    )
    assert "score" in run_cli("--help").stdout
