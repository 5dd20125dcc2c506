"""Cross-lingual sentence retrieval (mtft/forgetting/retrieval.py): the metric against hand-computed cases, the
bitext loader on small local files in both layouts (through data.sources, the code path of a Hub corpus), and the
config's one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch

from mtft.config import validate_config
from mtft.core.errors import ConfigError, DataError
from mtft.fixtures.lexicon import MARKERS, make_lexicon
from mtft.forgetting.retrieval import load_bitext, mean_pooled, retrieval_accuracy, retrieval_pairs


def test_mean_pooling_ignores_padding():
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]]])
    assert mean_pooled(hidden, torch.tensor([[1, 1, 0]])).tolist() == [[2.0, 1.0]]


def test_retrieval_accuracy_by_hand():
    # cosines of source rows (1,0), (0,1), (1,1) with target rows (1,0.1), (1,0), (0,1):
    #   s0: 0.995, 1, 0        -> nearest t1 (wrong)
    #   s1: 0.0995, 0, 1       -> nearest t2 (wrong)
    #   s2: 0.7739, 0.7071, 0.7071 -> nearest t0 (wrong)
    # target -> source: t0: 0.995, 0.0995, 0.7739 -> s0 (right); t1: 1, 0, 0.7071 -> s0 (wrong);
    #                   t2: 0, 1, 0.7071 -> s1 (wrong)
    source = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    target = torch.tensor([[1.0, 0.1], [1.0, 0.0], [0.0, 1.0]])
    assert retrieval_accuracy(source, target) == (0.0, pytest.approx(1 / 3))
    # scaled copies are perfect translations (cosine ignores length), in both directions
    assert retrieval_accuracy(source, 5 * source) == (1.0, 1.0)
    # a tie with another candidate counts against: two identical targets
    twins = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert retrieval_accuracy(twins, twins) == (pytest.approx(1 / 3), pytest.approx(1 / 3))


def config(tmp_path, **retrieval):
    return validate_config(
        {
            "data": {"tasks": [{"name": "xnli", "languages": ["en"]}], "sources": {"my/bitext": str(tmp_path)}},
            "forgetting": {"enabled": True, "retrieval": {"enabled": True, "path": "my/bitext", **retrieval}},
        },
        "test",
    )


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def test_a_pair_layout_file_loads_with_repeats_and_empties_dropped(tmp_path):
    # a Tatoeba-style pair file (mteb/tatoeba-bitext-mining: configs such as deu-eng, two sentence columns)
    folder = tmp_path / "data"
    rows = [
        {"sentence1": "Hallo", "sentence2": "Hello"},
        {"sentence1": "Danke", "sentence2": "Thanks"},
        {"sentence1": "Hallo", "sentence2": "Hi"},  # repeated source: two right answers, dropped
        {"sentence1": "", "sentence2": "Nothing"},  # empty: dropped
        {"sentence1": "Ja", "sentence2": "Yes"},
        {"sentence1": "Nein", "sentence2": "No"},
    ]
    write(folder / "deu-eng" / "test.jsonl", rows)
    cfg = config(tmp_path, name="{source}-{target}", split="test", max_sentences=3)
    cfg.data.sources["my/bitext"] = str(folder / "{name}" / "{split}.jsonl")
    bitext = load_bitext(cfg.forgetting.retrieval, cfg.corpus, cfg.data, "deu-eng")
    assert (bitext.source, bitext.target) == (["Hallo", "Danke", "Ja"], ["Hello", "Thanks", "Yes"])


def test_the_per_language_layout_of_the_built_in_corpus_is_parallel():
    cfg = validate_config(
        {
            "data": {"tasks": [{"name": "xnli", "languages": ["en", "de"]}]},
            "forgetting": {"enabled": True, "retrieval": {"enabled": True, "max_sentences": 50}},
        },
        "test",
    )
    bitext = load_bitext(cfg.forgetting.retrieval, cfg.corpus, cfg.data, "en-de")
    assert len(bitext.source) == len(bitext.target) == 50
    assert len(set(bitext.source)) == 50 and len(set(bitext.target)) == 50
    # row i of de says what row i of en says: the same concepts, word for word (both are subject-verb-object)
    assert [concepts(text, "en") for text in bitext.source] == [concepts(text, "de") for text in bitext.target]


def concepts(text: str, language: str) -> list[tuple[str, int]]:
    lex = make_lexicon(language)
    index = {
        lex.word(kind, i): (kind, i)
        for kind in ("nouns", "verbs", "places")
        for i in range(len(lex.nouns))
        if i < len(getattr(lex, kind))
    }
    index.update({lex.word(marker): (marker, 0) for marker in MARKERS})
    return [index[word] for word in text.split()]


def test_unequal_sides_and_bad_pairs_are_one_line_errors(tmp_path):
    folder = tmp_path / "data"
    write(folder / "en" / "validation.jsonl", [{"text": "a"}, {"text": "b"}])
    write(folder / "de" / "validation.jsonl", [{"text": "x"}])
    cfg = config(tmp_path)
    cfg.data.sources["my/bitext"] = str(folder / "{name}" / "{split}.jsonl")
    with pytest.raises(DataError, match="1 rows"):
        load_bitext(cfg.forgetting.retrieval, cfg.corpus, cfg.data, "en-de")
    with pytest.raises(ConfigError, match="'en' is not 'source-target'"):
        retrieval_pairs(cfg.forgetting.retrieval.model_copy(update={"pairs": ["en"]}), ["en", "de"])
    with pytest.raises(ConfigError, match="needs two languages"):
        retrieval_pairs(cfg.forgetting.retrieval, ["en"])
    assert retrieval_pairs(cfg.forgetting.retrieval, ["en", "de", "zh"]) == ["en-de", "en-zh"]
    with pytest.raises(ConfigError, match="must contain"):
        config(tmp_path, name="tatoeba")


def test_the_encoder_states_of_a_chosen_layer():
    from transformers import AutoModel, XLMRobertaConfig

    from mtft.forgetting.mlm import MaskedLM

    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16
    )
    mlm = MaskedLM(AutoModel.from_config(config).eval(), torch.nn.Linear(8, 20))
    ids, mask = torch.tensor([[0, 5, 6, 2]]), torch.ones(1, 4, dtype=torch.long)
    with torch.no_grad():
        last = mlm.hidden(ids, mask)
        assert torch.equal(mlm.hidden(ids, mask, layer=2), last)
        embedded = mlm.encoder.embeddings(input_ids=ids)
        assert torch.allclose(mlm.hidden(ids, mask, layer=0), embedded) and not torch.allclose(embedded, last)
