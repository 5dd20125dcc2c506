"""The contrastive L_p of an encoder pre-trained as e5 (mtft/forgetting/contrastive.py): InfoNCE against a hand
computation, its Hessian-vector products (λ_p's machinery) against autograd's in float64, the parallel held-out set
(prefixes, no batch without a negative, the pivot), and the config's refusals of settings that would do nothing."""

from __future__ import annotations

import datasets
import pytest
import torch

from mtft.config import validate_config
from mtft.config.schema import ContrastiveSection, CorpusSection, DataSection, ModelSection
from mtft.core.errors import ConfigError, DataError
from mtft.fixtures.hub_folder import write_hub_folder
from mtft.forgetting.contrastive import ContrastiveLp, ParallelEvalSet, build_parallel_eval_set
from mtft.forgetting.hessian import LpObjective
from mtft.forgetting.mlm import eager_attention
from mtft.models.backbone import build_encoder
from mtft.models.tokenizer import tiny_tokenizer

TEXTS = {
    "en": ["the dog sleeps", "a cat runs fast", "birds sing", "the sun is hot", "rain falls"],
    "de": ["der hund schläft", "eine katze läuft schnell", "vögel singen", "die sonne ist heiß", "regen fällt"],
    "fr": ["le chien dort", "un chat court vite", "les oiseaux chantent", "le soleil est chaud", "la pluie tombe"],
}


@pytest.fixture(scope="module")
def encoder_and_tokenizer(tmp_path_factory):
    texts = [t for ts in TEXTS.values() for t in ts] + ["query: passage:"]
    tokenizer = tiny_tokenizer(texts * 4, 120, tmp_path_factory.mktemp("tok"))
    torch.manual_seed(0)
    encoder = build_encoder(ModelSection(dropout=0.0), tokenizer, max_length=32, init_seed=0).double().eval()
    return encoder, tokenizer


def corpus(tmp_path, texts=TEXTS):
    """A Hub-layout corpus folder (one config per language, as the built-in ones)."""
    folder = tmp_path / "corpus"
    features = datasets.Features({"text": datasets.Value("string")})
    write_hub_folder(folder, features, {k: {"validation": [{"text": t} for t in v]} for k, v in texts.items()}, "")
    return CorpusSection(path=str(folder), languages=list(texts)), DataSection(
        tasks=[{"name": "xnli"}], sources={}, cache_dir=str(tmp_path / "cache")
    )


def test_the_loss_is_infonce_with_in_batch_negatives(tmp_path, encoder_and_tokenizer):
    encoder, tokenizer = encoder_and_tokenizer
    cfg = ContrastiveSection(temperature=0.05)
    eval_set = build_parallel_eval_set(cfg, *corpus(tmp_path), tokenizer, ["en", "de", "fr"], 32)
    assert eval_set.languages == ["de", "fr"] and eval_set.pivot == "en"  # each language against the pivot
    [batch] = eval_set.batches("de", 8)
    assert tokenizer.decode(batch["query_input_ids"][0], skip_special_tokens=True).startswith("query:")
    assert tokenizer.decode(batch["passage_input_ids"][0], skip_special_tokens=True).startswith("passage:")
    loss, pairs = ContrastiveLp(encoder, 0.05)(**batch)
    # by hand: mean-pooled last states, cosine similarities / τ, cross-entropy of each query against every passage

    def embed(ids, mask):
        hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return pooled / pooled.norm(dim=1, keepdim=True)

    q = embed(batch["query_input_ids"], batch["query_attention_mask"])
    p = embed(batch["passage_input_ids"], batch["passage_attention_mask"])
    logits = (q @ p.T) / 0.05
    expected = -(logits.diagonal() - torch.logsumexp(logits, dim=1)).sum()
    assert int(pairs) == 5
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-6)


def test_its_hessian_vector_products_are_autograds(tmp_path, encoder_and_tokenizer):
    """λ_p's machinery (LpObjective: functional_call at θ_p, double backward, one batch at a time) on the
    contrastive loss, against torch.autograd.functional.hvp of the same mean loss, in float64."""
    encoder, tokenizer = encoder_and_tokenizer
    lp = ContrastiveLp(encoder, 0.05).double()
    eval_set = build_parallel_eval_set(
        ContrastiveSection(temperature=0.05), *corpus(tmp_path), tokenizer, ["en", "de", "fr"], 32
    )
    batches = {lang: eval_set.batches(lang, 3) for lang in eval_set.languages}  # two batches each: 3 pairs and 2
    assert [len(b["query_input_ids"]) for b in batches["de"]] == [3, 2]
    names = [n for n, _ in lp.named_parameters() if "attention.self.query.weight" in n]
    objective = LpObjective(lp, names, batches, "cpu")
    point = {n: p.detach().clone() for n, p in lp.named_parameters()}
    vector = [torch.randn_like(point[n], generator=torch.Generator().manual_seed(1)) for n in names]
    _, _, ours = objective.hvp(point, vector)

    def mean_lp(*weights):
        params = {**point, **dict(zip(names, weights))}
        total = 0.0
        for language in batches:
            for batch in batches[language]:
                loss, _ = torch.func.functional_call(lp, params, args=(), kwargs=batch)
                total = total + loss * objective.scale[language]
        return total

    with eager_attention(lp.encoder):  # fused attention kernels have no second derivative
        _, theirs = torch.autograd.functional.hvp(mean_lp, tuple(point[n] for n in names), tuple(vector))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_a_last_pair_alone_joins_the_batch_before():
    rows = [[0, 5, 2]] * 5
    eval_set = ParallelEvalSet({"de": (rows, rows)}, pad_id=1, pivot="en")
    assert [len(b["query_input_ids"]) for b in eval_set.batches("de", 4)] == [5]  # not [4, 1]: 1 has no negative
    assert [len(b["query_input_ids"]) for b in eval_set.batches("de", 2)] == [2, 3]
    assert eval_set.fewest_masked("de") == 2


def test_bad_corpora_are_one_line(tmp_path, encoder_and_tokenizer):
    _, tokenizer = encoder_and_tokenizer
    cfg = ContrastiveSection()
    with pytest.raises(ConfigError, match="list at least two corpus languages"):
        build_parallel_eval_set(cfg, *corpus(tmp_path), tokenizer, ["en"], 32)
    with pytest.raises(ConfigError, match="pivot='sw' is not one of the corpus languages"):
        build_parallel_eval_set(ContrastiveSection(pivot="sw"), *corpus(tmp_path), tokenizer, ["en", "de"], 32)
    short = {**TEXTS, "de": TEXTS["de"][:3]}
    with pytest.raises(DataError, match="'de' has 3 held-out texts and the pivot 'en' 5; L_p needs a parallel corpus"):
        build_parallel_eval_set(cfg, *corpus(tmp_path / "short", short), tokenizer, ["en", "de"], 32)


@pytest.mark.parametrize(
    "forgetting, says",
    [
        ({"contrastive": {"temperature": 0.05}}, "contrastive applies with lp=contrastive"),
        ({"lp": "contrastive", "head_fit": {"steps": 10}}, "head_fit fits a masked-LM head, which lp=contrastive"),
    ],
)
def test_a_setting_of_the_other_lp_is_refused(forgetting, says):
    with pytest.raises(ConfigError, match=says):
        validate_config({"forgetting": {"enabled": True, **forgetting}}, "test")


@pytest.mark.parametrize(
    "model, says",
    [
        ({"vocabulary": "used"}, "vocabulary=used cuts a pre-trained backbone's vocabulary"),
        ({"weights": "random"}, "weights=random: the tiny encoder starts random already"),
    ],
)
def test_the_tiny_encoder_refuses_what_does_not_apply_to_it(model, says):
    with pytest.raises(ConfigError, match=says):
        validate_config({"model": {"backbone": "tiny", **model}}, "test")
