"""Tokenizers: the backbone's own, or for ``tiny`` a byte-pair-encoding tokenizer trained locally.

The tiny tokenizer mirrors XLM-R's conventions (NFKC, SentencePiece's Metaspace pre-tokenisation, ``<s> A </s></s>
B </s>`` pairs, special ids <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4) and is a fast tokenizer, so offsets and word ids
work. It is trained on the run's own text and cached under a key of that text and the vocabulary size.

Its model is BPE, not XLM-R's Unigram: on the small synthetic corpora the tiny encoder is trained on (a few dozen
word types per language), the ``tokenizers`` Unigram trainer keeps syllables and characters and stops far below
the vocabulary size asked for (486 pieces of 2,000 on the generic text of 4 languages), so every word was a
string of characters; BPE merges the frequent words into single pieces, as a real tokenizer does for frequent
words, and the masked-LM learns words rather than spelling (what makes the fixture world's languages
learnable as translations of one another: docs/fixtures.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Iterable, Optional

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mtft.core.errors import ConfigError
from mtft.models.folders import LOAD_ERRORS, check_backbone_code, first_line
from mtft.models.named_backbones import local_backbone

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

#: One character of a script written without spaces between words: Thai, Myanmar, Japanese kana, CJK ideographs
#: (the basic block, extension A and the compatibility block).
UNSPACED_CHARACTER = "[\u0e00-\u0e7f\u1000-\u109f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"


def load_backbone_tokenizer(backbone: str, revision: Optional[str], trust_remote_code: bool):
    source = local_backbone(backbone)
    check_backbone_code(source, trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)
    except LOAD_ERRORS as exc:
        raise ConfigError(f"cannot load the tokenizer of model.backbone={backbone!r}: {first_line(exc)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"model.backbone={backbone!r} has no fast tokenizer; offsets and word ids need one")
    return tokenizer


def tiny_tokenizer(texts: Iterable[str], vocab_size: int, cache_dir: Path) -> PreTrainedTokenizerFast:
    """Train (or load from the cache) a tokenizer on ``texts``."""
    texts = list(texts)
    digest = hashlib.sha256(f"bpe-v2|{vocab_size}|".encode())
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
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.NFKC()
    # Each character of a script without spaces is a pre-token of its own, as mBERT's tokenize_chinese_chars makes
    # CJK ideographs. With Metaspace alone a whole sentence of such a script is one pre-token, and on a small corpus
    # of recurring sentences (the fixture world) BPE merges them into single pieces: a sentence that is one token
    # teaches a masked-LM nothing (zh's L_p stayed at 5.4 through 8,000 steps of pre-training, its retrieval at
    # chance). A real corpus's sentences rarely recur, but a small vocabulary would still learn phrases of them.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Split(Regex(UNSPACED_CHARACTER), "isolated")]
    )
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    assert [tokenizer.id_to_token(i) for i in range(len(SPECIAL_TOKENS))] == SPECIAL_TOKENS
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
