"""A backbone cut to the word pieces of its texts (model.vocabulary: used; mtft/models/vocabulary.py): the same pieces,
the same vectors, the same outputs for those texts -- XLM-R's unigram tokenizer (mE5) and BERT's WordPiece, a
masked-LM head cut with the embeddings -- and one line for a tokenizer it cannot cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from mtft.core.errors import ConfigError
from mtft.fixtures.real_world.parallel import parallel_sentences
from mtft.models.named_backbones import local_backbone
from mtft.models.tokenizer import tiny_tokenizer
from mtft.models.vocabulary import MAP_FILE, check_reducible, kept_ids, write_reduced_backbone
from tests.helpers.tiny_bert import corpus_lines, tiny_bert, wordpiece_tokenizer

TEXTS = [s for language in ("en", "de", "ru", "ar", "zh", "th", "hi") for s in parallel_sentences()[language][:20]]
HELD_OUT = [s for language in ("en", "de", "ru", "ar", "zh", "th", "hi") for s in parallel_sentences()[language][40:]]


def cut(backbone: str, tokenizer, texts, folder: Path) -> list[int]:
    kept = kept_ids(tokenizer, texts)
    write_reduced_backbone(backbone, None, False, tokenizer, kept, folder)
    return kept


def same_pieces_and_outputs(full_folder, full_tokenizer, folder: Path, kept: list[int], texts, auto=AutoModel):
    reduced = AutoTokenizer.from_pretrained(folder)
    new_id = {old: new for new, old in enumerate(kept)}
    for text in texts:
        assert reduced(text)["input_ids"] == [new_id[i] for i in full_tokenizer(text)["input_ids"]], text
    full, small = auto.from_pretrained(full_folder).eval(), auto.from_pretrained(folder).eval()
    a = full_tokenizer(texts, padding=True, return_tensors="pt")
    b = reduced(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        if auto is AutoModel:
            assert torch.equal(full(**a).last_hidden_state, small(**b).last_hidden_state)
        else:  # the head's logits over the kept pieces are the full head's, column for column
            assert torch.equal(full(**a).logits[..., kept], small(**b).logits)
    return full, small


def test_multilingual_e5_cut_to_its_texts_is_exact(tmp_path):
    source = local_backbone("multilingual-e5-small")
    tokenizer = AutoTokenizer.from_pretrained(source)
    kept = cut("multilingual-e5-small", tokenizer, TEXTS, tmp_path / "cut")
    assert 500 < len(kept) < 5000 and kept[:4] == [0, 1, 2, 3] and kept[-1] == 250_001  # specials keep their ids
    full, small = same_pieces_and_outputs(Path(source), tokenizer, tmp_path / "cut", kept, TEXTS)
    assert small.get_input_embeddings().weight.shape == (len(kept), 384)
    assert torch.equal(small.get_input_embeddings().weight, full.get_input_embeddings().weight[kept])
    assert json.loads((tmp_path / "cut" / MAP_FILE).read_text())["original_ids"] == kept
    config = json.loads((tmp_path / "cut" / "config.json").read_text())
    assert config["vocab_size"] == len(kept) and config["pad_token_id"] == 1
    # text the vocabulary was not cut for: cut into the kept pieces (the characters of the texts are kept), or
    # unknown where a character never occurred -- the run's own texts are what it is exact for
    reduced = AutoTokenizer.from_pretrained(tmp_path / "cut")
    unseen = reduced("zzqx ⅏")["input_ids"]
    assert reduced.unk_token_id in unseen


def test_bert_wordpiece_and_a_masked_lm_head_are_cut_exactly(tmp_path):
    tokenizer = wordpiece_tokenizer(tmp_path / "vocab", corpus_lines("en", "de"))
    folder = tiny_bert(tmp_path / "bert", tokenizer, masked_lm=True)
    texts = corpus_lines("en")[:50]
    kept = cut(str(folder), tokenizer, texts, tmp_path / "cut")
    assert len(kept) < len(tokenizer)
    same_pieces_and_outputs(folder, tokenizer, tmp_path / "cut", kept, texts, AutoModelForMaskedLM)


def test_a_byte_pair_tokenizer_is_refused_in_one_line(tmp_path):
    tokenizer = tiny_tokenizer(["alpha beta gamma delta"] * 20, 100, tmp_path)
    with pytest.raises(ConfigError, match="is BPE; mtft cuts the vocabulary of Unigram and WordPiece") as error:
        check_reducible(tokenizer, "my-backbone")
    assert "\n" not in str(error.value)


def test_held_out_text_of_the_same_languages_mostly_keeps_its_pieces(tmp_path):
    """Sentences the vocabulary was not cut for, in the same languages: with every character of the texts kept,
    few pieces are unknown (measured here: the share is printed by the assertion)."""
    source = local_backbone("multilingual-e5-small")
    tokenizer = AutoTokenizer.from_pretrained(source)
    kept = kept_ids(tokenizer, TEXTS)
    from mtft.models.vocabulary import reduced_tokenizer

    reduced = reduced_tokenizer(tokenizer, kept)
    ids = [i for text in HELD_OUT for i in reduced(text)["input_ids"]]
    unknown = sum(i == reduced.unk_token_id for i in ids) / len(ids)
    assert unknown < 0.1, unknown
