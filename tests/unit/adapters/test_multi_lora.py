"""Shared-A Multi-LoRA: parameter identity, routing, frozen A, checkpoint round trip, mixed-batch training."""

from __future__ import annotations

import peft
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, RobertaConfig

from mtft.adapters import parameter_table
from mtft.adapters.lora import inject_lora, lora_layers
from mtft.adapters.multi_lora import MultiLoraLinear, inject_multi_lora, multi_lora_layers
from mtft.adapters.options import MultiLoraOptions
from mtft.core.rows import labelled_rows
from mtft.models.heads import SequenceClassificationHead
from mtft.models.multitask import MultiTaskModel
from tests.helpers.models import tiny_model


def roberta_base_on_meta():
    with torch.device("meta"):  # RoBERTa-base's shapes, no weights allocated
        return AutoModel.from_config(RobertaConfig(), add_pooling_layer=False)


def test_roberta_base_parameter_identity():
    """Paper Table 1: RoBERTa-base, r = 8, query/value of all 12 layers, 8 tasks."""
    encoder = roberta_base_on_meta()
    names = inject_multi_lora(encoder, MultiLoraOptions(r=8), num_adapters=8, seed=0)
    assert len(names) == 24
    stored = sum(p.numel() for n, p in encoder.named_parameters() if ".lora_" in n)
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    assert stored == 1_327_104  # r·in + k·r·out per layer: 24 · (8·768 + 8·8·768)
    assert trainable == 1_179_648  # k·r·out per layer
    table = {part: (stored, trainable) for part, stored, trainable in parameter_table(encoder)}
    assert table["adapters (lora_A, lora_B)"] == (1_327_104, 1_179_648)
    assert table["encoder weights"][1] == 0 and table["total"][1] == 1_179_648

    lora = roberta_base_on_meta()  # plain LoRA: a separate (A_i, B_i) per task, through PEFT
    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"])
    model = peft.get_peft_model(lora, config, adapter_name="task0")
    for i in range(1, 8):
        model.add_adapter(f"task{i}", config)
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) == 2_359_296


def routed_model(tmp_path, tasks=3):
    model, tok = tiny_model(tmp_path, num_objectives=tasks)
    model.heads = torch.nn.ModuleDict({f"t{i}": SequenceClassificationHead(64, ["x", "y"], 0.0) for i in range(tasks)})
    model = MultiTaskModel(model.encoder, dict(model.heads), tasks)
    inject_multi_lora(model.encoder, MultiLoraOptions(r=4, target_modules=["query", "value", "dense"]), tasks, seed=1)
    for layer in multi_lora_layers(model):
        torch.nn.init.normal_(layer.lora_B.weight, std=0.5)
    enc = tok(
        ["alpha beta", "gamma delta", "zeta eta", "theta alpha", "beta beta", "eta"], padding=True, return_tensors="pt"
    )
    return model.eval(), enc


def test_each_example_uses_only_its_tasks_b(tmp_path):
    model, enc = routed_model(tmp_path)
    tasks = torch.tensor([0, 1, 2, 0, 1, 2])
    with labelled_rows(task=tasks):
        before = model.encoder(**enc).last_hidden_state
    with torch.no_grad():
        for layer in multi_lora_layers(model):
            layer.lora_B.weight[1] += 0.3  # perturb task 1's B only
    with labelled_rows(task=tasks):
        after = model.encoder(**enc).last_hidden_state
    changed = (after - before).abs().amax(dim=(1, 2)) > 1e-6
    assert changed.tolist() == [False, True, False, False, True, False]


def test_mixed_batch_equals_each_task_alone(tmp_path):
    model, enc = routed_model(tmp_path)
    tasks = torch.tensor([2, 0, 1, 1, 0, 2])
    with labelled_rows(task=tasks):
        mixed = model.encoder(**enc).last_hidden_state
    for i in range(6):
        with labelled_rows(task=tasks[i : i + 1]):
            alone = model.encoder(
                input_ids=enc["input_ids"][i : i + 1], attention_mask=enc["attention_mask"][i : i + 1]
            ).last_hidden_state
        torch.testing.assert_close(mixed[i : i + 1], alone, rtol=1e-5, atol=1e-5)


def test_a_stays_frozen_and_b_trains(tmp_path):
    model, enc = routed_model(tmp_path)
    model.train()
    layers = multi_lora_layers(model)
    a_before = [m.lora_A.detach().clone() for m in layers]
    b_before = [m.lora_B.weight.detach().clone() for m in layers]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert all(not m.lora_A.requires_grad and not m.base_layer.weight.requires_grad for m in layers)
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    batch = dict(
        input_ids=enc["input_ids"],
        attention_mask=enc["attention_mask"],
        labels=torch.tensor([0, 1] * 3),
        head_index=torch.tensor([0, 1, 2, 0, 1, 2]),
        objective_index=torch.tensor([0, 1, 2, 0, 1, 2]),
    )
    for _ in range(3):
        sums, counts = model(**batch)
        (sums / counts.clamp(min=1)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(m.lora_A, a) for m, a in zip(layers, a_before))
    assert all(not torch.equal(m.lora_B.weight, b) for m, b in zip(layers, b_before))


def test_checkpoint_round_trip_is_bit_identical(tmp_path):
    model, enc = routed_model(tmp_path)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "m.safetensors"))
    other, _ = routed_model(tmp_path)
    for layer in multi_lora_layers(other):  # a different random A: reloading must restore the stored one
        torch.nn.init.normal_(layer.lora_A)
    other.load_state_dict(load_file(str(tmp_path / "m.safetensors")))
    tasks = torch.tensor([0, 1, 2, 0, 1, 2])
    with labelled_rows(task=tasks):
        assert torch.equal(model.encoder(**enc).last_hidden_state, other.encoder(**enc).last_hidden_state)


def test_adapter_outside_routing_and_bad_targets_fail_clearly(tmp_path):
    model, enc = routed_model(tmp_path)
    with pytest.raises(RuntimeError, match=r"outside labelled_rows\(task=...\)"):
        model.encoder(**enc)
    with pytest.raises(ValueError, match="matches no linear layer"):
        inject_multi_lora(roberta_base_on_meta(), MultiLoraOptions(target_modules=["qkv"]), 2, 0)


def test_gaussian_init_is_standard_normal_and_peft_init_is_kaiming_uniform():
    base = torch.nn.Linear(400, 10)
    gaussian = MultiLoraLinear(torch.nn.Linear(400, 10), 2, 64, 16, 0.0, "gaussian", torch.Generator().manual_seed(0))
    default = MultiLoraLinear(base, 2, 64, 16, 0.0, "peft", torch.Generator().manual_seed(0))
    assert abs(gaussian.lora_A.std().item() - 1.0) < 0.02
    assert default.lora_A.abs().max().item() <= 1 / 20 and abs(default.lora_A.std().item() - (1 / 20) / 3**0.5) < 2e-3
    assert torch.count_nonzero(default.lora_B.weight) == 0


def peft_lora_model(tmp_path, tasks=3):
    model, enc = routed_model(tmp_path, tasks)  # reuse the tokenised batch; replace Multi-LoRA by PEFT LoRA
    plain, _ = tiny_model(tmp_path, num_objectives=tasks)
    names = inject_lora(
        plain.encoder,
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]),
        [f"t{i}" for i in range(tasks)],
    )
    assert len(names) == 4  # query and value of the tiny encoder's 2 layers
    for layer in lora_layers(plain):
        for adapter in layer.lora_B.values():
            torch.nn.init.normal_(adapter.weight, std=0.5)
    return MultiTaskModel(plain.encoder, dict(model.heads), tasks).eval(), enc


def test_lora_method_routes_mixed_batches_through_each_tasks_peft_adapter(tmp_path):
    model, enc = peft_lora_model(tmp_path)
    tasks = torch.tensor([2, 0, 1, 1, 0, 2])
    with labelled_rows(task=tasks):
        mixed = model.encoder(**enc).last_hidden_state
    for i in range(6):
        with labelled_rows(task=tasks[i : i + 1]):
            alone = model.encoder(
                input_ids=enc["input_ids"][i : i + 1], attention_mask=enc["attention_mask"][i : i + 1]
            ).last_hidden_state
        torch.testing.assert_close(mixed[i : i + 1], alone, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        for layer in lora_layers(model):
            layer.lora_B["t1"].weight += 0.3
    with labelled_rows(task=tasks):
        after = model.encoder(**enc).last_hidden_state
    assert ((after - mixed).abs().amax(dim=(1, 2)) > 1e-6).tolist() == [False, False, True, True, False, False]


def test_lora_method_trains_every_present_tasks_adapter(tmp_path):
    model, enc = peft_lora_model(tmp_path)
    model.train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(f"lora_B.t{i}.weight" in " ".join(trainable) for i in range(3))
    assert not any("base_layer" in n or "embeddings" in n for n in trainable)
    batch = dict(
        input_ids=enc["input_ids"],
        attention_mask=enc["attention_mask"],
        labels=torch.tensor([0, 1] * 3),
        head_index=torch.tensor([0, 1, 0, 1, 0, 1]),
        objective_index=torch.tensor([0, 1, 0, 1, 0, 1]),
    )
    sums, counts = model(**batch)
    (sums / counts.clamp(min=1)).sum().backward()
    grads = {
        i: sum(
            layer.lora_A[f"t{i}"].weight.grad.abs().sum()
            for layer in lora_layers(model)
            if layer.lora_A[f"t{i}"].weight.grad is not None
        )
        for i in range(3)
    }
    assert grads[0] > 0 and grads[1] > 0 and grads[2] == 0  # task 2 has no row in the batch


def test_objective_granularity_routes_by_objective(tmp_path):
    model, enc = routed_model(tmp_path)
    for layer in multi_lora_layers(model):
        layer.route_by = "objective"
    tasks, objectives = torch.tensor([0, 0, 0, 0, 0, 0]), torch.tensor([0, 1, 2, 0, 1, 2])
    with labelled_rows(task=tasks, objective=objectives):
        before = model.encoder(**enc).last_hidden_state
    with torch.no_grad():
        for layer in multi_lora_layers(model):
            layer.lora_B.weight[2] += 0.3  # objective 2's B: rows 2 and 5, although every row is task 0's
    with labelled_rows(task=tasks, objective=objectives):
        after = model.encoder(**enc).last_hidden_state
    assert ((after - before).abs().amax(dim=(1, 2)) > 1e-6).tolist() == [False, False, True, False, False, True]
    with pytest.raises(RuntimeError, match=r"outside labelled_rows\(objective=...\)"):
        with labelled_rows(task=tasks):
            model.encoder(**enc)
