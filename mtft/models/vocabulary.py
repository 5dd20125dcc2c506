"""A backbone cut to the word pieces a run uses (``model.vocabulary: used``): the same pieces and vectors, fewer rows.

XLM-R's and mE5's 250,002-piece vocabulary makes the word-embedding table most of the model (96 M of
multilingual-e5-small's 118 M parameters): memory, optimizer state under full fine-tuning, the export. A run reads
a few thousand of those rows. :func:`kept_ids` tokenises the run's texts with the backbone's own tokenizer and keeps
the pieces they produce, the special tokens, and the single-character pieces of every character in them (so that a
new word written in those characters is never unknown); :func:`reduced_tokenizer` is the same tokenizer over the
kept pieces only, and :func:`write_reduced_backbone` the checkpoint with every vocabulary-sized tensor (the word
embeddings, a masked-LM head's decoder and bias) cut to the kept rows, in the kept order: kept piece k of the
original becomes id k everywhere.

Exact for the run's texts: a unigram tokenizer's best segmentation of a text uses kept pieces only, and it stays the
best among the fewer segmentations the kept vocabulary allows (likewise WordPiece's longest match), so every text the
run trains, evaluates or measures on is cut into the same pieces, which carry the same vectors -- the encoder's
outputs are those of the full model. A text outside the run's data may be cut differently (into smaller kept pieces)
or hold unknown pieces. Byte-pair tokenizers are refused: dropping a piece breaks the merges that build others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import AutoModel, AutoModelForMaskedLM, PreTrainedTokenizerFast

from mtft.core.errors import ConfigError
from mtft.models.loading import load_pretrained
from mtft.models.named_backbones import local_backbone

SUPPORTED = ("Unigram", "WordPiece")
MAP_FILE = "vocabulary.json"  # new id -> the original id, beside the cut checkpoint


def tokenizer_model(tokenizer) -> dict:
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]


def check_reducible(tokenizer, backbone: str) -> None:
    kind = tokenizer_model(tokenizer).get("type")
    if kind not in SUPPORTED:
        raise ConfigError(
            f"model.vocabulary=used: the tokenizer of model.backbone={backbone} is {kind}; mtft cuts the vocabulary of "
            f"{' and '.join(SUPPORTED)} tokenizers (XLM-R, mE5, BERT), whose segmentation of a text is unchanged by "
            "dropping pieces it does not use"
        )


def kept_ids(tokenizer, texts: Iterable[str]) -> list[int]:
    """The original ids to keep, sorted: every piece ``texts`` are cut into, the special tokens, and the
    single-character pieces of the characters in the texts."""
    texts = list(texts)
    kept = set(tokenizer.all_special_ids)
    for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]:
        kept.update(ids)
    vocab = tokenizer.get_vocab()
    normalizer = tokenizer.backend_tokenizer.normalizer
    characters = set()
    for text in texts:
        characters.update(normalizer.normalize_str(text) if normalizer is not None else text)
    prefixes = ("", "▁", "##")  # a piece alone, at a word's start (SentencePiece), inside a word (WordPiece)
    kept.update(vocab[p + c] for c in characters for p in prefixes if p + c in vocab)
    return sorted(kept)


def reduced_tokenizer(tokenizer, kept: Sequence[int]) -> PreTrainedTokenizerFast:
    """``tokenizer`` over the pieces ``kept`` (original ids, sorted), kept piece k becoming id k."""
    new_id = {old: new for new, old in enumerate(kept)}
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    model = data["model"]
    if model["type"] == "Unigram":
        pieces = model["vocab"]
        model["vocab"] = [pieces[old] for old in kept]
        if model.get("unk_id") is not None:
            model["unk_id"] = _remapped(model["unk_id"], new_id, "the unknown piece")
    elif model["type"] == "WordPiece":
        by_id = {i: piece for piece, i in model["vocab"].items()}
        model["vocab"] = {by_id[old]: new for new, old in enumerate(kept)}
    else:
        raise ConfigError(f"model.vocabulary=used cannot cut a {model['type']} tokenizer")
    data["added_tokens"] = [
        {**token, "id": _remapped(token["id"], new_id, token["content"])} for token in data.get("added_tokens", [])
    ]
    if data.get("post_processor") is not None:
        data["post_processor"] = _remap_processor(data["post_processor"], new_id)
    backend = Tokenizer.from_str(json.dumps(data))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=tokenizer.model_max_length,
        padding_side=tokenizer.padding_side,
        **{k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)},
    )


def _remapped(old: int, new_id: dict[int, int], what: str) -> int:
    if old not in new_id:
        raise ConfigError(f"model.vocabulary=used: {what} (id {old}) is not among the kept pieces")
    return new_id[old]


def _remap_processor(processor: dict, new_id: dict[int, int]) -> dict:
    """The ids a post-processor adds (TemplateProcessing's special tokens, BERT's and RoBERTa's [CLS]/[SEP])."""
    processor = dict(processor)
    kind = processor.get("type")
    if kind == "Sequence":
        processor["processors"] = [_remap_processor(p, new_id) for p in processor["processors"]]
    elif kind == "TemplateProcessing":
        processor["special_tokens"] = {
            name: {**token, "ids": [_remapped(i, new_id, name) for i in token["ids"]]}
            for name, token in processor["special_tokens"].items()
        }
    elif kind in ("BertProcessing", "RobertaProcessing"):
        for key in ("sep", "cls"):
            token, old = processor[key]
            processor[key] = [token, _remapped(old, new_id, token)]
    return processor


def write_reduced_backbone(
    backbone: str, revision, trust_remote_code: bool, tokenizer, kept: Sequence[int], folder: Path
) -> None:
    """The checkpoint of ``backbone`` with its vocabulary cut to ``kept``, and the cut tokenizer, into ``folder``:
    a masked-LM checkpoint stays one (its head's vocabulary rows cut too); weights the checkpoint lacks (a pooler)
    are not invented."""
    source = local_backbone(backbone)
    options = dict(revision=revision, trust_remote_code=trust_remote_code)
    with torch.random.fork_rng(devices=[]):
        model, info = load_pretrained(AutoModelForMaskedLM, source, **options)
        if any(k.split(".")[0] != model.base_model_prefix for k in info.missing | info.mismatched):
            model, info = load_pretrained(AutoModel, source, **options)  # no masked-LM head: the encoder alone
    rows = model.config.vocab_size
    index = torch.tensor(list(kept), dtype=torch.long)
    if int(index.max()) >= rows:
        raise ConfigError(f"model.backbone={backbone}: the tokenizer's ids exceed the {rows} embedding rows")
    state = {
        name: (value.index_select(0, index) if value.dim() and value.shape[0] == rows else value)
        for name, value in model.state_dict().items()
        if name not in info.missing
    }
    config = model.config
    config.vocab_size = len(kept)
    new_id = {old: new for new, old in enumerate(kept)}
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            setattr(config, key, new_id.get(value))
    with torch.random.fork_rng(devices=[]):
        reduced = type(model)(config)
    missing, unexpected = reduced.load_state_dict(state, strict=False)
    if unexpected or set(missing) - set(info.missing):
        raise ConfigError(f"model.vocabulary=used: the cut checkpoint of {backbone} does not load back ({missing})")
    # the checkpoint's own tensors only (save_pretrained would also write what the model class initialised)
    config.save_pretrained(str(folder))
    save_file({k: v.contiguous() for k, v in state.items()}, str(Path(folder) / "model.safetensors"), {"format": "pt"})
    reduced_tokenizer(tokenizer, kept).save_pretrained(str(folder))
    (Path(folder) / MAP_FILE).write_text(json.dumps({"original_ids": list(kept), "backbone": backbone}) + "\n")
