"""Multi-LoRA with LF-MLF: exact per-objective gradients of the routed B's, a Gram that is block-diagonal across
tasks, and the shared slots that ``weighting.shared: auto`` selects."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mtft.adapters import build_method
from mtft.adapters.multi_lora import inject_multi_lora, multi_lora_layers
from mtft.adapters.options import MultiLoraOptions
from mtft.config.schema import AdapterSection
from mtft.data.pipeline import Objective
from mtft.gradients import PerObjectiveGradients, reference_objective_gradients
from mtft.training.gradient_store import gradient_store
from mtft.training.gram_step import GramWeightedStep
from mtft.training.setup import shared_parameters
from tests.helpers.gradients import MIXED, SPANNING, FakeEngine, FixedGramWeighting, hooked_gradients, make_batch
from tests.helpers.models import tiny_model


def adapted(tmp_path, route_by="task", slots=2):
    model, tok = tiny_model(tmp_path)
    inject_multi_lora(
        model.encoder,
        MultiLoraOptions(r=4, target_modules=["query", "value", "output.dense"]),
        slots,
        seed=3,
        route_by=route_by,
    )
    for layer in multi_lora_layers(model):  # B = 0 at init would hide errors in the routed products
        torch.nn.init.normal_(layer.lora_B.weight, std=0.2)
    return model.double(), tok


@pytest.mark.parametrize("route_by, rows", [("task", MIXED), ("task", SPANNING), ("objective", MIXED)])
def test_routed_b_gradients_equal_float64_reference(tmp_path, route_by, rows):
    model, tok = adapted(tmp_path, route_by, slots=2 if route_by == "task" else 3)
    batch = make_batch(tok, **rows)
    got, params = hooked_gradients(model, batch, 3)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any(n.endswith("lora_B.weight") for n in names) and not any("lora_A" in n for n in names)
    torch.testing.assert_close(got, reference_objective_gradients(model, batch, params, 3), rtol=1e-10, atol=1e-12)


def test_gram_of_the_b_weights_is_block_diagonal_across_tasks(tmp_path):
    model, tok = adapted(tmp_path)
    collector = PerObjectiveGradients(model, 3).attach()
    detached = {n: p.detach() for n, p in model.named_parameters()}
    with collector.capturing():
        sums, _ = torch.func.functional_call(model, detached, args=(), kwargs=make_batch(tok, **MIXED))
    sums.sum().backward()
    b_weights = [layer.lora_B.weight for layer in multi_lora_layers(model)]
    gram = collector.gram(b_weights).numpy()
    # MIXED: objective 0 is task 1's, objectives 1 and 2 are task 0's
    assert gram[0, 1] == 0 and gram[0, 2] == 0 and gram[1, 2] != 0 and (np.diag(gram) > 0).all()
    only_task_0 = collector.gram(b_weights, only_rows={w: torch.tensor([0]) for w in b_weights}).numpy()
    assert only_task_0[0, 0] == 0 and only_task_0[1, 1] == gram[1, 1]


def fake_data(objective_names, units, unit_objective, tasks):
    return SimpleNamespace(
        objective_names=objective_names,
        train_units=[Objective(*u) for u in units],
        unit_objective=unit_objective,
        tasks=dict.fromkeys(tasks),
    )


def test_auto_shares_the_b_of_a_task_with_several_objectives_only(tmp_path):
    model, _ = adapted(tmp_path)  # heads a (2 labels) and b
    data = fake_data(["a/en", "a/de", "b/en"], [("a", "en"), ("a", "de"), ("b", "en")], [0, 1, 2], ["a", "b"])
    shared, rows = shared_parameters(model, data, "auto", build_method(AdapterSection(method="multi_lora")))
    b_weights = {layer.lora_B.weight for layer in multi_lora_layers(model)}
    assert b_weights <= set(shared) and all(rows[w].tolist() == [0] for w in b_weights)
    head_a = set(model.heads["a"].parameters())
    assert head_a <= set(shared) and not set(model.heads["b"].parameters()) & set(shared)
    per_task = fake_data(["a", "b"], [("a", "en"), ("a", "de"), ("b", "en")], [0, 0, 1], ["a", "b"])
    # every B and head private: nothing to balance
    assert shared_parameters(model, per_task, "auto", build_method(AdapterSection(method="multi_lora"))) == ([], {})
    everything, rows = shared_parameters(model, per_task, "all", build_method(AdapterSection(method="multi_lora")))
    assert b_weights <= set(everything) and rows == {}


def test_lfmlf_step_with_multi_lora_updates_only_the_b_slots_of_present_tasks(tmp_path):
    model, tok = adapted(tmp_path)
    batch = make_batch(tok, **{k: v[:4] for k, v in MIXED.items()})  # task 0's rows only (objectives 1, 2)
    batch["head_index"] = torch.tensor([0, 0, 0, 0])
    batch["objective_index"] = torch.tensor([2, 1, 1, 2])
    batch["labels"] = torch.tensor([1, 0, 0, 1])
    before = [layer.lora_B.weight.detach().clone() for layer in multi_lora_layers(model)]
    b_weights = [layer.lora_B.weight for layer in multi_lora_layers(model)]
    store = gradient_store(FakeEngine(model), 3, 1, b_weights, {w: torch.tensor([0]) for w in b_weights})
    step = GramWeightedStep(store, FixedGramWeighting([0.25, 0.75]))
    step([batch])
    for weight in b_weights:  # task 1 is absent: its B gets an exactly zero gradient
        assert torch.count_nonzero(weight.grad[1]) == 0 and torch.count_nonzero(weight.grad[0]) > 0
    _, counts = model(**batch)
    reference = reference_objective_gradients(model, batch, b_weights, 3) / counts.detach().clamp(min=1)[:, None]
    expected = 0.25 * reference[1] + 0.75 * reference[2]
    torch.testing.assert_close(torch.cat([w.grad.reshape(-1) for w in b_weights]), expected, rtol=1e-9, atol=1e-12)
    assert all(torch.equal(w, b) for w, b in zip(b_weights, before))  # FakeEngine.step does not move weights
