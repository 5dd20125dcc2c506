"""Per-objective gradients (hooks) against the float64 reference, and the Gram step's update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtft.core.errors import Diverged
from mtft.gradients import PerObjectiveGradients, reference_objective_gradients
from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep, StepOptions
from mtft.training.step import LossWeightedStep
from mtft.weighting import MeanWeighting
from tests.helpers.gradients import (
    MIXED,
    TEXTS,
    FakeEngine,
    FixedGramWeighting,
    gram_step_against_weighted_loss,
    hooked_gradients,
    lora_model,
    make_batch,
)
from tests.helpers.models import tiny_model


@pytest.mark.parametrize("sort_rows", [False, True])
def test_full_finetuning_gradients_equal_float64_reference(tmp_path, sort_rows):
    model, tok = tiny_model(tmp_path)
    model = model.double()
    batch = make_batch(tok, **MIXED)  # mixed objectives, several heads, padded sequences
    assert (batch["attention_mask"] == 0).any()
    if sort_rows:
        order = torch.argsort(batch["objective_index"], stable=True)
        batch = {k: v[order] for k, v in batch.items()}
    got, params = hooked_gradients(model, batch, 3)
    expected = reference_objective_gradients(model, batch, params, 3)
    assert all(p.grad is None for p in params)  # the ordinary weight gradients were never computed
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert (expected.abs().sum(1) > 0).all()


def test_lora_parameters_equal_float64_reference(tmp_path):
    model, tok = lora_model(tmp_path)
    model = model.double()
    batch = make_batch(tok, **MIXED)
    got, params = hooked_gradients(model, batch, 3)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("lora_A" in n for n in names) and not any("attention.self.query.base_layer" in n for n in names)
    torch.testing.assert_close(got, reference_objective_gradients(model, batch, params, 3), rtol=1e-10, atol=1e-12)


def test_gram_over_accumulated_micro_batches_equals_reference_on_the_whole_step(tmp_path):
    model, tok = tiny_model(tmp_path)
    model = model.double()
    whole = make_batch(tok, **MIXED)
    halves = [{k: v[:4] for k, v in whole.items()}, {k: v[4:] for k, v in whole.items()}]
    weighting = FixedGramWeighting()
    params = [p for p in model.parameters() if p.requires_grad]
    GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params), weighting)(halves)
    _, counts = model(**whole)
    reference = reference_objective_gradients(model, whole, params, 3) / counts.detach().unsqueeze(1)
    np.testing.assert_allclose(weighting.seen, (reference @ reference.t()).numpy(), rtol=1e-10)


def test_update_is_the_gradient_of_the_weighted_loss(tmp_path):
    model, tok = tiny_model(tmp_path)
    weights = [0.5, 0.2, 0.3]
    result = gram_step_against_weighted_loss(model.double(), make_batch(tok, **MIXED), weights)
    assert result.weights.tolist() == weights
    assert result.extras["d_norm_sq"] > 0 and 0 < result.extras["stationarity"]


def test_equal_weights_reproduce_the_mean_step(tmp_path):
    model, tok = tiny_model(tmp_path)
    model = model.double()
    batch = make_batch(tok, **MIXED)
    params = [p for p in model.parameters() if p.requires_grad]
    LossWeightedStep(FakeEngine(model), MeanWeighting(), 3, 1)([batch])
    expected = [p.grad.clone() for p in params]
    model.zero_grad()
    GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params), FixedGramWeighting())([batch])
    for p, g in zip(params, expected):
        torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-13)


def test_absent_objectives_are_dropped(tmp_path):
    model, tok = tiny_model(tmp_path, num_objectives=4)
    batch = make_batch(tok, **MIXED)  # objective 3 has no rows
    weighting = FixedGramWeighting()
    params = [p for p in model.parameters() if p.requires_grad]
    result = GramWeightedStep(gradient_store(FakeEngine(model), 4, 1, params), weighting)([batch])
    assert weighting.seen.shape == (3, 3)
    assert result.weights[3] == 0 and np.isnan(result.losses[3].item()) and result.counts[3] == 0


def test_refused_gram_skips_the_step(tmp_path):
    model, tok = tiny_model(tmp_path)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    step = GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params), FixedGramWeighting(fail=True))
    result = step([make_batch(tok, **MIXED)])
    assert "NaN/inf" in result.skipped and result.rows(["a", "b", "c"]) == []  # the loop logs the skip alone
    assert all(p.grad is None for p in params) and all(torch.equal(p, b) for p, b in zip(params, before))


def test_the_step_result_carries_the_rows_the_loop_logs(tmp_path):
    """Every step kind returns a StepResult that says what to log (issue 30): the Gram step its weighting row every
    step and the cosines when formed, the loss-weighted step none -- the loop never asks a step what it is."""
    model, tok = tiny_model(tmp_path)
    params = [p for p in model.parameters() if p.requires_grad]
    names = ["a", "b", "c"]
    store = gradient_store(FakeEngine(model), 3, 1, params)
    gram = GramWeightedStep(store, FixedGramWeighting(), StepOptions(cosine_every=2))
    first, second = gram([make_batch(tok, **MIXED)]), gram([make_batch(tok, **MIXED)])
    assert [kind for kind, _ in first.rows(names)] == ["weighting"] and first.skipped is None
    weighting, cosines = second.rows(names)
    assert set(weighting[1]) >= {"weight/a", "weight/b", "weight/c", "d_norm_sq", "stationarity"}
    assert cosines[0] == "cosines" and cosines[1]["objectives"] == names and len(cosines[1]["matrix"]) == 3
    plain = LossWeightedStep(FakeEngine(model), MeanWeighting(), 3, 1)([make_batch(tok, **MIXED)])
    assert plain.rows(names) == [] and plain.skipped is None


def test_unsupported_trainable_modules_are_named(tmp_path):
    model, _ = tiny_model(tmp_path)
    model.extra = torch.nn.Conv1d(2, 2, 1)
    with pytest.raises(ValueError, match=r"extra \(Conv1d\)"):
        PerObjectiveGradients(model, 3)


def test_consecutive_steps_start_from_clean_buffers(tmp_path):
    """Buffers are cleared lazily (dense) and by touched rows (embeddings): a second step with other
    objectives and tokens must see only its own gradients."""
    model, tok = tiny_model(tmp_path)
    model = model.double()
    first = make_batch(tok, **MIXED)
    second = make_batch(
        tok,
        objectives=[1, 1, 0, 0],
        heads=[0, 0, 1, 1],
        labels=[0, 1, 2, 0],
        texts=["theta zeta", "eta", "gamma gamma gamma", "delta epsilon"],
    )
    weighting = FixedGramWeighting()
    params = [p for p in model.parameters() if p.requires_grad]
    step = GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params), weighting)
    for batch in (first, second):
        model.zero_grad()
        step([batch])
        _, counts = model(**batch)
        present = counts > 0
        reference = reference_objective_gradients(model, batch, params, 3)[present] / counts.detach()[present, None]
        np.testing.assert_allclose(weighting.seen, (reference @ reference.t()).numpy(), rtol=1e-10, atol=1e-14)


def test_buffers_in_another_dtype_than_the_activations(tmp_path):
    """float32 buffers under float64 activations (as float32 buffers under bf16 ones): the product is cast
    before it is written, and the step's first write still overwrites the lazily cleared buffer."""
    model, tok = tiny_model(tmp_path)
    model = model.double()
    params = [p for p in model.parameters() if p.requires_grad]
    collector = PerObjectiveGradients(model, 3, dtype=torch.float32).attach()
    detached = {n: p.detach() for n, p in model.named_parameters()}
    second = make_batch(
        tok,
        objectives=[1, 1, 0, 0],
        heads=[0, 0, 1, 1],
        labels=[0, 1, 2, 0],
        texts=["theta zeta", "eta", "gamma gamma gamma", "delta epsilon"],
    )
    for batch in (make_batch(tok, **MIXED), second):
        collector.zero()
        with collector.capturing():
            sums, _ = torch.func.functional_call(model, detached, args=(), kwargs=batch)
        sums.sum().backward()
        collector.finalize()
    got = torch.cat([collector.gradient(p).reshape(3, -1) for p in params], dim=1).double()
    torch.testing.assert_close(got, reference_objective_gradients(model, second, params, 3), rtol=1e-4, atol=1e-5)


def test_non_finite_weights_stop_the_run_before_the_update(tmp_path):
    """A weighting (a user's own included) that returns NaN weights would turn every trained weight into NaN: the
    step raises instead, with the weights untouched, so the last checkpoint stays good."""
    model, tok = tiny_model(tmp_path)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    step = GramWeightedStep(gradient_store(FakeEngine(model), 3, 1, params), FixedGramWeighting([0.5, np.nan, 0.5]))
    with pytest.raises(
        Diverged, match=r"weighting fixed_for_tests returned non-finite weights at step 1 .*not applied"
    ):
        step([make_batch(tok, **MIXED)])
    assert all(torch.equal(p, b) for p, b in zip(params, before))


def test_a_leaf_made_for_an_output_gradient_keeps_no_grad(tmp_path):
    """The embeddings' outputs on detached parameters are made leaves so that the backward pass reaches their hooks;
    autograd's copy of their gradient in ``.grad`` (the size of the output) is dropped, not held to the step's end."""
    model, tok = tiny_model(tmp_path)
    collector = PerObjectiveGradients(model, 3).attach()
    seen = []
    model.encoder.embeddings.word_embeddings.register_forward_hook(lambda m, i, out: seen.append(out))
    detached = {n: p.detach() for n, p in model.named_parameters()}
    with collector.capturing():
        sums, _ = torch.func.functional_call(model, detached, args=(), kwargs=make_batch(tok, **MIXED))
    sums.sum().backward()
    [leaf] = seen
    assert leaf.is_leaf and leaf.requires_grad and leaf.grad is None
    assert collector.sparse[model.encoder.embeddings.word_embeddings.weight].touched().numel() > 0  # the hook ran


def bert_model(tmp_path):
    """Full fine-tuning of a small BERT (mBERT, mE5, MiniLM): its absolute position embedding is looked up once for
    the whole batch, position_ids of shape (1, length), and broadcast over the rows."""
    from transformers import AutoModel

    from mtft.models.heads import SequenceClassificationHead
    from mtft.models.multitask import MultiTaskModel
    from tests.helpers.tiny_bert import corpus_lines, tiny_bert, wordpiece_tokenizer

    tok = wordpiece_tokenizer(tmp_path / "vocab", corpus_lines("en")[:200] + TEXTS * 20, vocab_size=300)
    encoder = AutoModel.from_pretrained(str(tiny_bert(tmp_path / "bert", tok)), add_pooling_layer=False)
    heads = {
        "a": SequenceClassificationHead(32, ["x", "y"], 0.0),
        "b": SequenceClassificationHead(32, list("pqr"), 0.0),
    }
    return MultiTaskModel(encoder, heads, 3), tok


@pytest.mark.parametrize("bufferless", [False, True])
def test_a_position_embedding_shared_by_the_rows_gets_each_rows_gradient(tmp_path, bufferless):
    """Every objective's gradient of BERT's position embeddings (and of every other weight) equals the float64
    reference; without one lookup per row, the broadcast lookup's gradient is every row's sum and the hook could
    not attribute it (the run stopped at its first step)."""
    model, tok = bert_model(tmp_path)
    model = model.double()
    batch = make_batch(tok, **MIXED)
    got, params = hooked_gradients(model, batch, 3)
    expected = reference_objective_gradients(model, batch, params, 3)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    position = model.encoder.embeddings.position_embeddings.weight
    index = [i for i, p in enumerate(params) if p is position][0]
    offset = sum(p.numel() for p in params[:index])
    assert (expected[:, offset : offset + position.numel()].abs().sum(1) > 0).all()  # each objective's own rows
    store = gradient_store(FakeEngine(model), 3, 1, params, buffers="none" if bufferless else "full")
    step = GramWeightedStep(store, FixedGramWeighting([0.5, 0.2, 0.3]))
    step([make_batch(tok, **MIXED)])  # the step itself, buffered and bufferless, on the same model
    assert all(p.grad is not None for p in params)
