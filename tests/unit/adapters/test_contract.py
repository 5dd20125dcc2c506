"""The contract every registered adapter method keeps (table-driven, as PEFT tests its tuners), on a tiny encoder:
apply, routing, mixed batches, checkpoint round trip, per-objective gradients, the monitors' displacement,
the probe's slots and export. A method added to the registry is tested by adding nothing here."""

from __future__ import annotations

import copy

import peft
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel

from mtft.adapters import METHODS, build_method, get_method
from mtft.commands.export import base_encoder, peft_model_for
from mtft.config import load_config, validate_config
from mtft.config.schema import AdapterSection
from mtft.core.errors import CheckpointError, ConfigError
from mtft.core.rows import labelled_rows
from mtft.forgetting.mlm import MaskedLM
from mtft.models.mixout import apply_mixout
from tests.helpers.gradients import MIXED, hooked_gradients, make_batch
from tests.helpers.models import tiny_model

TASKS = ["a", "b"]  # tiny_model's heads
OBJECTIVES = ["b/en", "a/en", "a/de"]  # MIXED's objectives 0, 1, 2 are rows of heads 1, 0, 0
TEXTS = ["alpha beta", "gamma delta epsilon", "zeta", "eta theta alpha", "beta beta", "delta"]


def options(name: str, granularity: str, **given) -> AdapterSection:
    """The section of method ``name``: the options of this contract's cases that the method takes."""
    given = {"granularity": granularity, "r": 4, "alpha": 8.0, "target_modules": ["query", "value"], **given}
    own = METHODS.options_model(name).model_fields
    return AdapterSection(method=name, **{key: value for key, value in given.items() if key in own})


def cases() -> list[tuple[str, str]]:
    """Every registered method; a second case for each that routes by objective with granularity=objective."""
    found = [(name, "task") for name in sorted(METHODS)]
    return found + [
        (name, "objective")
        for name in sorted(METHODS)
        if build_method(options(name, "objective")).routing == "objective"
    ]


CASES = cases()


def build(tmp_path, name, granularity, seed=0):
    model, tok = tiny_model(tmp_path, num_objectives=len(OBJECTIVES))
    method = build_method(options(name, granularity))
    method.apply(model.encoder, TASKS, OBJECTIVES, seed)
    return model.eval(), tok, method


@torch.no_grad()
def perturb(model, seed):
    """Move every trainable weight (the adapters' B's off zero; each slot's differently)."""
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        if param.requires_grad:
            param.add_(0.1 * torch.randn(param.shape, generator=generator, dtype=param.dtype))


def encode(tok, texts=TEXTS):
    enc = tok(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def hidden(encoder, enc, slots):
    """Hidden states with row n routed to slot ``slots[n]`` (declared as its task and its objective, as the
    masked-LM measurement does)."""
    slots = torch.as_tensor(slots)
    with labelled_rows(task=slots, objective=slots):
        return encoder(**enc).last_hidden_state


def slot_names(method):
    return {None: [], "task": TASKS, "objective": OBJECTIVES}[method.routing]


def effective_weights(encoder, slot):
    """Every weight a row routed to ``slot`` meets: a parameter as it is, and an adapted layer's (one with a
    ``base_layer``) effective weight, read off as its response to the identity minus its bias."""
    adapted = [n for n, m in encoder.named_modules() if hasattr(m, "base_layer")]
    out = {}
    for name in adapted:
        layer = encoder.get_submodule(name)
        eye = torch.eye(layer.base_layer.in_features, dtype=layer.base_layer.weight.dtype)
        rows = torch.full((eye.shape[0],), slot)
        with labelled_rows(task=rows, objective=rows):
            out[f"{name}.base_layer.weight"] = (layer(eye) - layer(torch.zeros_like(eye))).T
    for name, param in encoder.named_parameters():
        if not any(name.startswith(prefix + ".") for prefix in adapted):
            out[name] = param
    return out


def squared_distance(encoder, reference, slot):
    """||θ − θ'||² over the effective weights of ``slot``; either side an encoder or its effective weights."""
    ours, theirs = (x if isinstance(x, dict) else effective_weights(x, slot) for x in (encoder, reference))
    return sum(((ours[n] - theirs[n].detach()).double() ** 2).sum() for n in ours)


# ---------------------------------------------------------------------------------------------------------
def test_every_builtin_method_is_registered_and_covered():
    assert {"full", "head", "lora", "multi_lora"} <= set(METHODS)
    assert ("multi_lora", "objective") in CASES


@pytest.mark.parametrize("name, granularity", CASES)
def test_apply_is_deterministic_and_names_its_slots(tmp_path, name, granularity):
    model, _, method = build(tmp_path, name, granularity)
    again, _, _ = build(tmp_path, name, granularity)
    assert method.slots(TASKS, OBJECTIVES) == slot_names(method)
    assert method.probe_slots(TASKS, OBJECTIVES) == (slot_names(method) or [""])
    assert any(p.requires_grad for p in model.parameters())
    state, other = model.state_dict(), again.state_dict()
    assert list(state) == list(other) and all(torch.equal(state[k], other[k]) for k in state)
    if method.routing is not None:  # an adapter whose targets match nothing is a config error, not silence
        with pytest.raises(ConfigError, match="model.adapter: .*qkv"):
            build_method(options(name, granularity, target_modules=["qkv"])).apply(
                tiny_model(tmp_path)[0].encoder, TASKS, OBJECTIVES, 0
            )


@pytest.mark.parametrize("name, granularity", CASES)
def test_trains_encoder_says_whether_the_encoders_own_weights_train(tmp_path, name, granularity):
    """What stability.mixout relies on (mtft.config.schema refuses it where trains_encoder is false): a method
    that trains the encoder leaves every linear layer of it trainable, and Mixout then swaps them all."""
    model, _, method = build(tmp_path, name, granularity)
    own = [m for m in model.encoder.modules() if type(m) is torch.nn.Linear]
    assert own and method.trains_encoder == all(m.weight.requires_grad for m in own)
    if method.trains_encoder:
        assert apply_mixout(model.encoder, 0.1) == len(own)


@pytest.mark.parametrize("name, granularity", CASES)
def test_rows_go_through_their_slots_adapter_and_a_mixed_batch_equals_each_row_alone(tmp_path, name, granularity):
    model, tok, method = build(tmp_path, name, granularity)
    perturb(model, seed=1)
    enc = encode(tok)
    count = max(len(slot_names(method)), 1)
    with torch.no_grad():
        each = [hidden(model.encoder, enc, [j] * len(TEXTS)) for j in range(count)]
        if method.routing is None:  # nothing routed: the labels change nothing
            assert torch.equal(hidden(model.encoder, enc, [1] * len(TEXTS)), each[0])
        for i in range(count):
            for j in range(i):
                assert (each[i] - each[j]).abs().max() > 1e-4  # every slot is its own adapter
        slots = [(2 * n + 1) % count for n in range(len(TEXTS))]
        mixed = hidden(model.encoder, enc, slots)
        for n, slot in enumerate(slots):
            torch.testing.assert_close(mixed[n], each[slot][n], rtol=1e-5, atol=1e-5)
            alone = hidden(model.encoder, {k: v[n : n + 1] for k, v in enc.items()}, [slot])
            torch.testing.assert_close(mixed[n : n + 1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, granularity", CASES)
def test_checkpoint_round_trip_into_a_fresh_model_built_the_same_way(tmp_path, name, granularity):
    model, tok, method = build(tmp_path, name, granularity)
    perturb(model, seed=1)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    fresh, _, _ = build(tmp_path, name, granularity, seed=7)  # other random adapter weights until loaded
    fresh.load_state_dict(load_file(str(tmp_path / "model.safetensors")))
    enc = encode(tok)
    slots = [n % max(len(slot_names(method)), 1) for n in range(len(TEXTS))]
    with torch.no_grad():
        assert torch.equal(hidden(model.encoder, enc, slots), hidden(fresh.encoder, enc, slots))


@pytest.mark.parametrize("name, granularity", CASES)
def test_per_objective_gradients_equal_the_float64_reference_or_gram_weightings_are_refused(
    tmp_path, name, granularity
):
    from mtft.gradients import reference_objective_gradients

    raw = {
        "data": {"tasks": [{"name": "xnli"}]},
        "weighting": {"method": "lfmlf"},
        "model": {"adapter": options(name, granularity).model_dump(mode="json")},
    }
    method = build_method(options(name, granularity))
    if not method.supports_gram:
        with pytest.raises(ConfigError, match="needs per-objective gradients"):
            validate_config(raw, "test")
        return
    validate_config(raw, "test")
    model, tok, method = build(tmp_path, name, granularity)
    perturb(model, seed=1)  # B ≠ 0, so that every adapter weight has a gradient
    model = model.double()
    batch = make_batch(tok, **MIXED)
    got, params = hooked_gradients(model, batch, len(OBJECTIVES))
    expected = reference_objective_gradients(model, batch, params, len(OBJECTIVES))
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    users = method.slot_users([2, 1], len(OBJECTIVES))
    for param, rows in method.shared_rows(model, [2, 1], len(OBJECTIVES)).items():
        assert param.requires_grad and param.shape[0] == len(slot_names(method))
        assert rows.tolist() == [j for j, u in enumerate(users.tolist()) if u > 1]


@pytest.mark.parametrize("name, granularity", CASES)
def test_monitors_displacement_equals_the_explicit_weights(tmp_path, name, granularity):
    model, tok, method = build(tmp_path, name, granularity)
    model = model.double()
    tracker = method.tracker(model.encoder, TASKS, OBJECTIVES)
    if tracker is None:
        assert method.monitors_off
        return
    groups = slot_names(method) or [""]
    assert tracker.groups == groups
    routed = [tracker.adapter(g) for g in range(len(groups))]
    assert routed == (list(range(len(groups))) if slot_names(method) else [0])
    with torch.no_grad():
        pretrained = {slot: effective_weights(copy.deepcopy(model.encoder), slot) for slot in routed}
    perturb(model, seed=1)
    update, distance = tracker.measure()
    with torch.no_grad():
        for g, slot in enumerate(routed):
            explicit = float(squared_distance(model.encoder, pretrained[slot], slot))
            assert distance[g] == pytest.approx(explicit, rel=1e-9) and update[g] == pytest.approx(explicit, rel=1e-9)
        tracker.advance()
        step_start = {slot: effective_weights(copy.deepcopy(model.encoder), slot) for slot in routed}
    perturb(model, seed=2)
    update, distance = tracker.measure()
    names, _ = tracker.hessian_subset()
    point = tracker.pretrained_point()
    with torch.no_grad():
        for g, slot in enumerate(routed):
            now = effective_weights(model.encoder, slot)
            assert update[g] == pytest.approx(float(squared_distance(now, step_start[slot], slot)), rel=1e-9)
            assert distance[g] == pytest.approx(float(squared_distance(now, pretrained[slot], slot)), rel=1e-9)
            for n, delta in zip(names, tracker.delta(g, names)):
                key = n.removeprefix("encoder.")
                torch.testing.assert_close(delta, now[key] - pretrained[slot][key], rtol=1e-9, atol=1e-12)
                torch.testing.assert_close(point[n], pretrained[slot][key], rtol=0, atol=0)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        with tracker.at_pretrained():
            assert all(float(squared_distance(model.encoder, pretrained[slot], slot)) == 0 for slot in routed)
        assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())

        # the budget's "scale": α = 0 undoes a group's step, α = 1 keeps it
        moved = {slot: float(squared_distance(model.encoder, pretrained[slot], slot)) for slot in routed}
        alphas = [float(g % 2) for g in range(len(groups))]
        tracker.scale_update(alphas)
        _, scaled = tracker.measure()
        for g, (slot, alpha) in enumerate(zip(routed, alphas)):
            if alpha:
                assert scaled[g] == pytest.approx(moved[slot], rel=1e-12)
            else:
                assert float(squared_distance(model.encoder, step_start[slot], slot)) < 1e-24

    # the penalty λ·Σ_g ||θ_g − θ_p||² by gradient hooks, one half per micro-batch of two
    params = [p for p in model.encoder.parameters() if p.requires_grad]
    penalty = 0.7 * sum(squared_distance(model.encoder, pretrained[slot], slot) for slot in routed)
    expected = torch.autograd.grad(penalty, params, allow_unused=True)
    handles = tracker.regularize(0.7, accumulation=2)
    grads = torch.autograd.grad(sum((p * 0).sum() for p in params), params)
    for handle in handles:
        handle.remove()
    for got, want in zip(grads, expected):
        torch.testing.assert_close(2 * got, torch.zeros_like(got) if want is None else want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name, granularity", CASES)
def test_probe_models_route_every_row_to_their_slot(tmp_path, name, granularity):
    model, tok, method = build(tmp_path, name, granularity)
    perturb(model, seed=1)
    head = torch.nn.Linear(64, len(tok))
    mlm = MaskedLM(model.encoder, head)
    enc = encode(tok)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    with torch.no_grad():
        for slot, _ in enumerate(method.probe_slots(TASKS, OBJECTIVES)):
            with mlm.routed_to(slot):
                loss, _ = mlm(enc["input_ids"], enc["attention_mask"], labels)
            states = hidden(model.encoder, enc, [slot] * len(TEXTS))
            expected = torch.nn.functional.cross_entropy(
                head(states[labels != -100]), labels[labels != -100], reduction="sum"
            )
            torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("name, granularity", CASES)
def test_export_loads_back_with_peft_and_gives_the_same_hidden_states(tmp_path, name, granularity):
    model, tok, method = build(tmp_path, name, granularity)
    if not method.exports_lora:
        with pytest.raises(CheckpointError, match="no LoRA adapters"):
            method.peft_config()
        with pytest.raises(CheckpointError, match="no LoRA adapters"):
            method.adapter_weights(model.encoder, 0, "")
        return
    perturb(model, seed=1)
    base_encoder(model.encoder).save_pretrained(str(tmp_path / "base"))
    enc = encode(tok)
    for slot, slot_name in enumerate(method.slots(TASKS, OBJECTIVES)):
        folder = tmp_path / "export" / slot_name
        peft_model_for(model.encoder, method, slot, slot_name, str(tmp_path / "base")).save_pretrained(str(folder))
        loaded = peft.PeftModel.from_pretrained(AutoModel.from_pretrained(str(tmp_path / "base")), str(folder)).eval()
        with torch.no_grad():
            theirs = loaded(**enc).last_hidden_state
            ours = hidden(model.encoder, enc, [slot] * len(TEXTS))
        torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
USER_METHOD = '''
from mtft.adapters import AdapterMethod
from mtft.adapters.full import FullDisplacement


class FrozenEmbeddings(AdapterMethod):
    """Full fine-tuning with the embeddings frozen."""

    name = "frozen_embeddings"
    monitors_off = None

    def inject(self, encoder, task_names, objective_names, seed):
        encoder.get_input_embeddings().requires_grad_(False)

    def tracker(self, encoder, task_names, objective_names):
        return FullDisplacement(encoder)


class NotAMethod:
    pass
'''


def write_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  tasks:\n    - name: xnli\n")
    return path


def test_a_users_own_method_loads_from_module_and_class(tmp_path, monkeypatch):
    (tmp_path / "my_adapter_methods.py").write_text(USER_METHOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config(
        write_config(tmp_path), ["model.adapter.method=my_adapter_methods:FrozenEmbeddings", "weighting.method=lfmlf"]
    )
    method = build_method(config.model.adapter)
    assert type(method).__name__ == "FrozenEmbeddings"
    assert get_method("my_adapter_methods:FrozenEmbeddings") is type(method)
    model, _ = tiny_model(tmp_path)
    method.apply(model.encoder, TASKS, OBJECTIVES, 0)
    assert not model.encoder.get_input_embeddings().weight.requires_grad
    assert model.encoder.encoder.layer[0].attention.self.query.weight.requires_grad
    assert method.tracker(model.encoder, TASKS, OBJECTIVES).groups == [""]
    with pytest.raises(ConfigError, match="NotAMethod is not a subclass of mtft.adapters.base.AdapterMethod"):
        load_config(write_config(tmp_path), ["model.adapter.method=my_adapter_methods:NotAMethod"])
    with pytest.raises(ConfigError, match="module 'my_adapter_methods' has no attribute 'Missing'"):
        load_config(write_config(tmp_path), ["model.adapter.method=my_adapter_methods:Missing"])


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "magic",
            "model.adapter.method: unknown adapter method 'magic'; valid choices: full, head, lora, multi_lora; "
            "or module:Class, a mtft.adapters.base.AdapterMethod subclass in an importable module (got 'magic')",
        ),
        ("no_such_module_here:Method", "cannot import 'no_such_module_here' (No module named 'no_such_module_here')"),
    ],
)
def test_an_unknown_method_is_one_line_naming_the_choices(tmp_path, value, message):
    path = write_config(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(path, [f"model.adapter.method={value}"])
    assert message in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)
