"""A small random BERT checkpoint with a WordPiece tokenizer, saved as a Hub-style folder: what all-MiniLM-L6-v2
is (segment ids, [CLS]/[SEP], WordPiece, no masked-LM head), small enough for unit tests."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import BertWordPieceTokenizer
from transformers import BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast

from mtft.fixtures import GENERIC_TEXT
from tests.helpers.launch import REPO

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus_lines(*languages: str) -> list[str]:
    """Texts of the built-in generic corpus and of the XNLI and TyDiQA fixtures, for the vocabulary."""
    import json

    lines = []
    for language in languages:
        for split in ("train", "validation"):
            path = GENERIC_TEXT / language / f"{split}.jsonl"
            lines += [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    for path in [*(REPO / "tasks/xnli/fixtures/xnli").glob("*/*.jsonl"), *(REPO / "tasks").glob("tydiqa/**/*.jsonl")]:
        for line in path.read_text(encoding="utf-8").splitlines()[:200]:
            row = json.loads(line)
            lines += [v for v in row.values() if isinstance(v, str)]
    return lines


def wordpiece_tokenizer(folder: Path, texts: list[str], vocab_size: int = 600) -> BertTokenizerFast:
    folder.mkdir(parents=True, exist_ok=True)
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False)
    trainer.save_model(str(folder))
    return BertTokenizerFast.from_pretrained(str(folder), do_lower_case=True)  # reads folder/vocab.txt


def tiny_bert(folder: Path, tokenizer: BertTokenizerFast, masked_lm: bool = False, seed: int = 0) -> Path:
    """A random 2-layer BERT saved in ``folder``: a bare ``BertModel`` (with its pooler, as sentence-transformers
    ships MiniLM) or, with ``masked_lm``, a ``BertForMaskedLM`` with its head."""
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = BertForMaskedLM(config) if masked_lm else BertModel(config)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
