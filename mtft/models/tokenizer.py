"""Tokenizers: the backbone's own, or for ``tiny`` a SentencePiece-style Unigram tokenizer trained locally.

The tiny tokenizer mirrors XLM-R's (NFKC, Metaspace pre-tokenisation, Unigram model, ``<s> A </s></s> B </s>``
pairs, special ids <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4) and is a fast tokenizer, so offsets and word ids
work. It is trained on the run's own text and cached under a key of that text and the vocabulary size.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Optional

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mtft.core.errors import ConfigError

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def load_backbone_tokenizer(backbone: str, revision: Optional[str], trust_remote_code: bool):
    try:
        tokenizer = AutoTokenizer.from_pretrained(backbone, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the tokenizer of model.backbone={backbone!r}: {_first_line(exc)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"model.backbone={backbone!r} has no fast tokenizer; offsets and word ids need one")
    return tokenizer


def tiny_tokenizer(texts: Iterable[str], vocab_size: int, cache_dir: Path) -> PreTrainedTokenizerFast:
    """Train (or load from the cache) a tokenizer on ``texts``."""
    texts = list(texts)
    digest = hashlib.sha256(f"unigram-v2|{vocab_size}|".encode())
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    folder = cache_dir / "tokenizers" / digest.hexdigest()[:24]
    if not (folder / "tokenizer.json").is_file():
        # Written beside the final folder and renamed into place, so that concurrent ranks and crashed runs
        # never see a half-written tokenizer.
        tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        _train(texts, vocab_size).save_pretrained(str(tmp))
        try:
            tmp.rename(folder)
        except OSError:  # another process won the race; its tokenizer is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def _train(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.model = _canonical_unigram(tokenizer)
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        sep_token="</s>",
        cls_token="<s>",
        pad_token="<pad>",
        mask_token="<mask>",
    )


def _canonical_unigram(tokenizer: Tokenizer) -> models.Unigram:
    """The trained Unigram model with run-independent ids and scores.

    The ``tokenizers`` Unigram trainer is not deterministic: the same texts give the same pieces, but the scores
    differ in their last bits, and the required single characters it appends (all at about the lowest score) come
    in hash-map order, so ids move between trainings -- and with them every embedding row of a model pre-trained
    on the tokenizer. Rounding the scores to 0.01 (far below what changes a segmentation in practice) and ordering
    ties by the piece itself makes the tokenizer a function of its texts.
    """
    state = json.loads(tokenizer.to_str())["model"]
    special = [tuple(piece) for piece in state["vocab"][: len(SPECIAL_TOKENS)]]
    assert [piece for piece, _ in special] == SPECIAL_TOKENS, special
    pieces = sorted(
        ((piece, round(score, 2)) for piece, score in state["vocab"][len(SPECIAL_TOKENS) :]),
        key=lambda item: (-item[1], item[0]),
    )
    return models.Unigram(special + pieces, unk_id=state["unk_id"], byte_fallback=False)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
