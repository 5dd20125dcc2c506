"""SURT (stability.surt) in a run on the pre-trained tiny backbone: the backbone is re-trained on the task's
training text and cached; fine-tuning starts from the re-trained weights (another result than fine-tuning the
pre-trained one), and a second run with the same settings reuses the checkpoint without re-training."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.helpers.launch import run_cli
from tests.helpers.runs import BASE_CONFIG, base_overrides

STEPS = 4
RUN = {
    "pretrain.before_finetune": True,
    "pretrain.tokens": 8192,  # 4 steps of 32 x 64 tokens
    "stability.surt.enabled": True,
    "stability.surt.tokens": 4096,  # 2 steps
    "weighting.method": "mean",
    "weighting.options": {},
    "data.tasks.0.languages": "[en,de]",
    "checkpointing.every_steps": STEPS,
    "evaluation.every_steps": STEPS,
    "logging.every_steps": STEPS,
}


def finetune(out: Path, cache: Path, **extra) -> str:
    result = run_cli("--config", BASE_CONFIG, *base_overrides(out, STEPS, **{**RUN, **extra}), MTFT_CACHE=str(cache))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def final(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"checkpoints/step-{STEPS:08d}/model.safetensors"))


def only_entry(folder: Path) -> Path:
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1, entries
    assert (entries[0] / "COMPLETE").is_file()
    return entries[0]


def test_surt_retrains_once_and_fine_tuning_starts_from_it(tmp_path):
    cache = tmp_path / "cache"
    log = finetune(tmp_path / "surt", cache)
    assert "SURT: re-training the backbone" in log and "from the cache" not in log.split("SURT:")[1]
    surt, pretrained = only_entry(cache / "surt"), only_entry(cache / "pretrained")
    assert f"-> {surt}" in log
    retrained, original = load_file(str(surt / "model.safetensors")), load_file(str(pretrained / "model.safetensors"))
    assert retrained.keys() == original.keys()
    encoder = [k for k in original if ".encoder.layer." in k]
    assert encoder and all(not torch.equal(retrained[k], original[k]) for k in encoder if k.endswith("query.weight"))

    again = finetune(tmp_path / "again", cache)  # same settings: the cached checkpoint, not a re-training
    assert f"SURT: re-trained backbone from the cache: {surt}" in again and "SURT: re-training" not in again
    assert only_entry(cache / "surt") == surt
    first, second = final(tmp_path / "surt"), final(tmp_path / "again")
    assert all(torch.equal(first[k], second[k]) for k in first)

    finetune(tmp_path / "plain", cache, **{"stability.surt.enabled": False})  # the pre-trained backbone itself
    plain = final(tmp_path / "plain")
    assert plain.keys() == first.keys() and not all(torch.equal(first[k], plain[k]) for k in first)

    assert probe(tmp_path, cache).returncode == 0  # under the re-trained backbone's masked-LM head
    surt.rename(surt.with_name("moved"))
    missing = probe(tmp_path, cache)
    assert missing.returncode != 0 and "its SURT re-trained backbone is not in the cache" in missing.stderr


def probe(tmp_path: Path, cache: Path):
    checkpoint = str(tmp_path / f"surt/checkpoints/step-{STEPS:08d}")
    args = ["--gamma", "0.5", "--languages", "en", "--max-examples", "10", "--out", str(tmp_path / "probe")]
    return run_cli("probe", "--checkpoint", checkpoint, *args, MTFT_CACHE=str(cache))
