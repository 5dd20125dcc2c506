"""Reading a model folder mtft did not write (mtft.models.folders), table-driven: no code from the folder ever
runs and nothing is asked on stdin; every damaged file is one line naming it -- for a run's encoder/ and for a
backbone folder (model.backbone), as a damaged MiniLM cache folder would be."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mtft.config.schema import ModelSection
from mtft.core.errors import CheckpointError, ConfigError
from mtft.models.backbone import _pretrained
from mtft.models.folders import folder_config, folder_tokenizer, read_json
from mtft.models.tokenizer import load_backbone_tokenizer
from tests.helpers.tiny_bert import corpus_lines, tiny_bert, wordpiece_tokenizer

EVIL = "import pathlib\npathlib.Path(__file__).with_name('CODE_RAN').write_text('ran')\n"


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bert")
    return tiny_bert(folder, wordpiece_tokenizer(folder / "vocab", corpus_lines("en")))


def edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


# fault: (damage, which reader, what the one line holds)
CASES = {
    "config-auto-map": (
        lambda f: edit_json(f / "config.json", auto_map={"AutoConfig": "evil.Config", "AutoModel": "evil.Model"}),
        "config",
        "config.json asks to run Python code shipped with the",
    ),
    "tokenizer-auto-map": (
        lambda f: edit_json(f / "tokenizer_config.json", auto_map={"AutoTokenizer": ["evil.Tok", None]}),
        "tokenizer",
        "tokenizer_config.json asks to run Python code",
    ),
    "config-not-json": (lambda f: (f / "config.json").write_text("{oops"), "config", "config.json: not JSON"),
    "config-not-utf8": (lambda f: (f / "config.json").write_bytes(b"\xff\xfe{}"), "config", "config.json: not UTF-8"),
    "config-unknown-model-type": (
        lambda f: edit_json(f / "config.json", model_type="no-such-model"),
        "config",
        "config.json: ",
    ),
    "tokenizer-file-not-json": (
        lambda f: (f / "tokenizer.json").write_text("{"),
        "tokenizer",
        "(its tokenizer): ",
    ),
    "tokenizer-gone": (
        lambda f: [p.unlink() for p in f.iterdir() if p.name != "config.json" and p.is_file()],
        "tokenizer",
        "(its tokenizer)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_or_damaged_folder_is_one_line_and_runs_no_code(bert, tmp_path, case):
    folder = tmp_path / "model"
    shutil.copytree(bert, folder)
    (folder / "evil.py").write_text(EVIL)
    damage, reader, expect = CASES[case]
    damage(folder)
    with pytest.raises(CheckpointError) as raised:
        (folder_config if reader == "config" else folder_tokenizer)(folder)
    assert expect in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    assert not (folder / "CODE_RAN").exists()


def test_an_intact_folder_loads(bert):
    assert folder_config(bert).model_type == "bert"
    assert folder_tokenizer(bert).is_fast


@pytest.mark.parametrize(
    "content, expect",
    [(None, "missing"), (b"\xff", "not UTF-8"), (b"{", "not JSON"), (b'{"a": 1}', None)],
)
def test_read_json_names_the_file(tmp_path, content, expect):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_bytes(content)
    if expect is None:
        assert read_json(path) == {"a": 1}
        return
    with pytest.raises(CheckpointError, match=rf"x\.json: {expect}"):
        read_json(path)


# a backbone folder (model.backbone): a MiniLM cache folder cut short by a full disk, or edited
BACKBONE = {
    "weights-truncated": lambda f: truncate(f / "model.safetensors"),
    "weights-a-pickle": lambda f: (f / "model.safetensors").write_bytes(b"\x80\x04\x95" + b"\0" * 64),
    "config-not-json": lambda f: (f / "config.json").write_text("{"),
}


@pytest.mark.parametrize("case", sorted(BACKBONE))
def test_a_damaged_backbone_folder_is_one_line(bert, tmp_path, case):
    folder = tmp_path / "backbone"
    shutil.copytree(bert, folder)
    BACKBONE[case](folder)
    with pytest.raises(ConfigError) as raised:
        _pretrained(ModelSection(backbone=str(folder)))
    message = str(raised.value)
    assert message.startswith(f"cannot load model.backbone={str(folder)!r}: ") and "\n" not in message, message
    assert len(message) < 500


def test_a_backbone_with_remote_code_is_refused_unless_the_user_trusts_it(bert, tmp_path):
    folder = tmp_path / "backbone"
    shutil.copytree(bert, folder)
    (folder / "evil.py").write_text(EVIL)
    edit_json(folder / "tokenizer_config.json", auto_map={"AutoTokenizer": ["evil.Tok", None]})
    edit_json(folder / "config.json", auto_map={"AutoModel": "evil.Model"})
    with pytest.raises(ConfigError) as raised:
        load_backbone_tokenizer(str(folder), None, False)
    with pytest.raises(ConfigError):
        _pretrained(ModelSection(backbone=str(folder), trust_remote_code=False))
    assert "\n" not in str(raised.value)
    assert not (folder / "CODE_RAN").exists()
