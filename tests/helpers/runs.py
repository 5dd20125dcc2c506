"""End-to-end runs: the base config the e2e tests start from and its overrides, a task file of one's own on the
XNLI fixtures, the JSONL logs a run writes, and the LF-MLF / ZeRO-3 runs that several e2e modules compare."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from safetensors.torch import load_file

from tests.helpers.launch import (  # noqa: F401
    MULTIPROCESS,
    REPO,
    THREADS,
    WARM,
    clean_env,
    free_port,
    kill_tree,
    run_cli,
    run_launcher,
    run_process,
    run_script,
    run_torchrun,
)


def xnli_task_spec(name: str, languages: list[str], head: str = "sequence_classification", **fields) -> dict:
    """A task file's fields for a task of its own on the XNLI fixtures (in-language, premise and hypothesis)."""
    return {
        "task": name,
        "head": head,
        **fields,
        "languages": languages,
        "default_protocol": "in_language",
        "text_columns": ["premise", "hypothesis"],
        "metrics": ["accuracy"],
        "data": {
            "train": {"path": "facebook/xnli", "name": "{language}", "split": "train"},
            "validation": {"path": "facebook/xnli", "name": "{language}", "split": "validation"},
        },
    }


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


BASE_CONFIG = "tests/e2e/base.yaml"


def base_overrides(out: Path, steps: int, **extra) -> list[str]:
    """Overrides of the e2e base run (:data:`BASE_CONFIG`): output in ``out``, ``steps`` steps, plus ``extra``
    (``{"a.b": value}``). A string is passed as written (YAML, e.g. ``"[en, de]"``); any other value as JSON, so
    ``None`` is null, ``False`` false and a dict or list a whole mapping or list."""
    values = {"run.output_dir": str(out), "training.max_steps": steps, **extra}
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items()]


def second_task(folder: Path) -> Path:
    """A second task on the XNLI fixtures, so that ranks often hold different task heads in one step."""
    folder.mkdir(parents=True)
    (folder / "nli_copy.yaml").write_text(yaml.safe_dump(xnli_task_spec("nli_copy", ["sw", "ru"])))
    return folder


STEPS = 12


def lfmlf_run(out: Path, zero: int, micro: int, **extra) -> list[str]:
    # LF-MLF (the base's weighting) on the base's random encoder, the one these tolerances were set on (with a
    # pre-trained one ZeRO-0 vs 1 differ by ~1.8e-5)
    return base_overrides(
        out,
        STEPS,
        **{
            "training.deepspeed_config": f"configs/deepspeed/zero{zero}.json",
            "training.micro_batch_size": micro,
            "model.classifier_dropout": 0.0,
            "data.tasks.0.languages": "[en, de, ar]",
            "logging.every_steps": 1,
            "checkpointing.every_steps": 6,
            "evaluation.every_steps": None,
            "weighting.cosine_every": 4,
            **extra,
        },
    )


def weighting_events(out: Path) -> list[dict]:
    return [e for e in read_jsonl(out / "metrics.jsonl") if e["kind"] == "weighting"]


def assert_same_d_norm(a: dict, b: dict) -> None:
    """||d||² = wᵀGw of two runs that differ only in float32 summation order. Near Pareto stationarity it is a
    small difference of entries of size ~||g_t||² (||d||²/mean||g_t||² reaches 1e-5 here), so its rounding error
    scales with mean||g_t||², not with ||d||²."""
    tolerance = 1e-4 * max(a["d_norm_sq"], a["mean_grad_norm_sq"] * 1e-2)
    assert abs(a["d_norm_sq"] - b["d_norm_sq"]) <= tolerance, (a["step"], a["d_norm_sq"], b["d_norm_sq"])


def final_weights(out: Path):
    return load_file(str(out / f"checkpoints/step-{STEPS:08d}/model.safetensors"))


METHODS = {
    "multi_lora": {"model.adapter.method": "multi_lora", "training.optimizer.lr": 1e-2},
    "full": {},
}  # the base: full fine-tuning at lr 1e-3


def partitioned_zero3(folder: Path) -> Path:
    """configs/deepspeed/zero3.json with no persistence threshold: DeepSpeed otherwise keeps every tensor under
    100k elements whole on each rank, which at the tiny encoder's shapes is all but the embedding table."""
    config = json.loads(Path("configs/deepspeed/zero3.json").read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = folder / "zero3_partitioned.json"
    path.write_text(json.dumps(config))
    return path
