"""The forgetting monitors of a PEFT LoRA run (``model.adapter.method: lora``): every task's adapter is its own
model θ_i = W0 + s·B_i·A_i, measured through its own adapter -- not, as the full-fine-tuning tracker would, every
row through the first task's."""

from __future__ import annotations

import copy
import time

import peft
import pytest
import torch

from mtft.adapters.lora import lora_layers
from mtft.forgetting.mlm import attach_head, lp_per_language
from tests.helpers.forgetting import TARGETS, TASKS, Log, lora_run


def task_model(encoder, plain, task):
    """``plain`` with task's adapter merged into its weights: W0 + s·B·A, no routing involved."""
    merged = copy.deepcopy(plain)
    with torch.no_grad():
        for name, module in encoder.named_modules():
            if isinstance(module, peft.tuners.lora.LoraLayer):
                update = module.scaling[task] * module.lora_B[task].weight @ module.lora_A[task].weight
                merged.get_submodule(name).weight += update
    return merged


def test_lora_monitor_measures_every_task_through_its_own_adapter(tmp_path):
    model, plain, monitor = lora_run(tmp_path)
    assert monitor.groups == TASKS
    update, distance = monitor.tracker.measure()
    for g, task in enumerate(TASKS):
        merged = task_model(model.encoder, plain, task)
        explicit = sum(
            float(
                (merged.get_parameter(f"{name}.weight") - plain.get_parameter(f"{name}.weight"))
                .detach()
                .double()
                .pow(2)
                .sum()
            )
            for name, _ in plain.named_modules()
            if name.endswith(tuple(TARGETS))
        )
        assert distance[g] == pytest.approx(explicit, rel=1e-6) and update[g] == pytest.approx(explicit, rel=1e-6)
        lp = monitor._lp_group(g)
        expected = lp_per_language(attach_head(merged, monitor.mlm_model), monitor.eval_set, 8, "cpu")
        assert lp == pytest.approx(expected, rel=1e-5)
    assert monitor._lp_group(0) != pytest.approx(monitor._lp_group(1), rel=1e-3)


def test_lora_monitor_reports_forgetting_and_bounds_per_task(tmp_path):
    model, plain, monitor = lora_run(tmp_path)
    log = Log()
    with torch.no_grad():  # θ_p is the plain encoder: measured at B = 0
        before = {n: p.clone() for n, p in model.encoder.named_parameters()}
    monitor.start(0, log)
    assert all(torch.equal(p, before[n]) for n, p in model.encoder.named_parameters())  # θ_p put back exactly
    pretrained = lp_per_language(attach_head(plain, monitor.mlm_model), monitor.eval_set, 8, "cpu")
    assert monitor.lp_pretrained == pytest.approx(pretrained, rel=1e-5)
    monitor.evaluate(1)
    [(_, _, values)] = [e for e in log.events if e[1] == "forgetting"]
    for task in TASKS:
        assert {f"F_p/{task}", f"F_p/{task}/en", f"bound_displacement/{task}", f"prediction/{task}"} <= set(values)
        merged = lp_per_language(
            attach_head(task_model(model.encoder, plain, task), monitor.mlm_model), monitor.eval_set, 8, "cpu"
        )
        assert values[f"F_p/{task}/de"] == pytest.approx(merged["de"] - pretrained["de"], rel=1e-4, abs=1e-6)


def test_lora_regularization_and_budget_scale_act_per_task(tmp_path):
    model, plain, monitor = lora_run(tmp_path)
    model.double()  # the hooks' gradients against autograd's to float64 precision
    tracker = monitor.tracker
    tracker.advance()
    _, start = tracker.measure()
    tracker.advance()
    layers = lora_layers(model.encoder)
    with torch.no_grad():
        for layer in layers:
            for task in TASKS:
                layer.lora_A[task].weight.mul_(1.1)
                layer.lora_B[task].weight.add_(0.05)
    _, moved = tracker.measure()
    tracker.scale_update([0.0, 1.0])  # task a's step undone, task b's kept
    update, distance = tracker.measure()
    assert update[0] == 0.0 and distance[0] == pytest.approx(start[0], rel=1e-12)
    assert distance[1] == pytest.approx(moved[1], rel=1e-12)

    params = [w for layer in layers for task in TASKS for w in (layer.lora_A[task].weight, layer.lora_B[task].weight)]

    def penalty():
        return sum(
            ((layer.scaling[t] * layer.lora_B[t].weight @ layer.lora_A[t].weight) ** 2).sum()
            for layer in layers
            for t in TASKS
        )

    expected = torch.autograd.grad(0.3 * penalty(), params)
    handles = tracker.regularize(0.3, accumulation=2)
    grads = torch.autograd.grad(sum((p * 0).sum() for p in params), params)
    for handle in handles:
        handle.remove()
    for got, want in zip(grads, expected):
        torch.testing.assert_close(2 * got, want, rtol=1e-10, atol=1e-12)


def test_lambda_p_is_cached_for_theta_p_whatever_the_adapters_initialisation(tmp_path):
    """At θ_p every B is zero: the function, and so λ_p, is W0's whatever A is. The cache key leaves the adapters
    out, so the seeds of a study (each drawing its own A) share one λ_p; the base weights still key it."""
    keys = []
    for seed in (0, 1):
        model, _, monitor = lora_run(tmp_path / str(seed), seed=seed)
        with monitor.tracker.at_pretrained():
            keys.append(monitor._cache_key())
        a = next(p for n, p in model.named_parameters() if "lora_A" in n)
        keys.append(float(a.detach().abs().sum()))
    assert keys[0] == keys[2] and keys[1] != keys[3]  # the same key, though A differs
    with torch.no_grad(), monitor.tracker.at_pretrained():
        next(p for n, p in model.named_parameters() if "base_layer" in n).add_(1.0)
        assert monitor._cache_key() != keys[0]


def test_runs_started_together_compute_lambda_p_once(tmp_path, monkeypatch):
    """Two runs on one θ_p (a study's cells of one seed) starting at once: the first computes λ_p under the cache
    entry's lock, the second waits for it and reads the value it wrote."""
    import threading

    import mtft.forgetting.monitor as monitor_module

    computed = []
    real = monitor_module.top_eigenvalue

    def slow_top_eigenvalue(*args, **kwargs):
        computed.append(threading.get_ident())
        time.sleep(0.5)  # long enough for the other run to reach the cache entry meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(monitor_module, "top_eigenvalue", slow_top_eigenvalue)
    monitors = [lora_run(tmp_path / name)[2] for name in ("a", "b")]
    shared = monitors[0]._cache_path(monitors[0]._cache_key())
    results = {}

    def start(index: int) -> None:
        monitor = monitors[index]
        monitor._cache_path = lambda key: shared  # one cache for both, as on one machine
        with monitor.tracker.at_pretrained():
            results[index] = monitor._lambda_p()

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(computed) == 1
    (first, first_cached), (second, second_cached) = sorted(results.values(), key=lambda r: r[1])
    assert (first_cached, second_cached) == (False, True) and first.value == second.value
