"""Wall-time overhead of the forgetting monitors at their default settings, measured side by side in one run.

    python bench/forgetting_overhead.py [--steps 400] [--repeats 2] [--method multi_lora|full]

Runs the demo config (pre-trained tiny encoder, Multi-LoRA, LF-MLF; or full fine-tuning at lr 1e-3) with the monitors
off and on -- defaults of the ``forgetting`` section, i.e. Σ||Δθ_k||² and ||θ − θ_p|| every step, F_p, the
bounds and the second-order prediction every ``forgetting.every_steps`` (its default) and at the end, no probe --
alternating A/B so that load
on the machine hits both alike. λ_p and the pre-trained backbone come from the cache (a warm-up run fills it:
λ_p is computed once per checkpoint, not per run). "training" is the loop plus the monitors' final
measurement (``Training._train`` + ``monitor.end``); "run" is everything ``Run.execute`` does. Prints the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--method", choices=["multi_lora", "full"], default="multi_lora")
    args = parser.parse_args()
    os.chdir(REPO)
    from mtft.config import load_config
    from mtft.config.schema import ForgettingSection
    from mtft.forgetting.monitor import ForgettingMonitor
    from mtft.training.trainer import Run, Training

    timings: dict[str, list[float]] = {}
    current = {"label": None, "loop": 0.0}
    original_train, original_end = Training._train, ForgettingMonitor.end

    def timed_train(self, signals):
        start = time.perf_counter()
        original_train(self, signals)
        current["loop"] += time.perf_counter() - start

    def timed_end(self, step):
        start = time.perf_counter()
        original_end(self, step)
        current["loop"] += time.perf_counter() - start

    Training._train, ForgettingMonitor.end = timed_train, timed_end
    extra = (
        ["model.adapter.method=full", "training.optimizer.lr=1e-3", "model.dropout=0.1"]
        if args.method == "full"
        else []
    )  # multi_lora: the demo as it is
    every = ForgettingSection.model_fields["every_steps"].default  # the default, not the demo's 50
    with tempfile.TemporaryDirectory() as tmp:

        def run(label: str, enabled: bool, record: bool = True) -> None:
            overrides = [
                f"run.output_dir={tmp}/{label}",
                "run.overwrite=true",
                "logging.progress_bar=false",
                f"training.max_steps={args.steps}",
                "evaluation.every_steps=null",
                "checkpointing.every_steps=null",
                f"forgetting.enabled={str(enabled).lower()}",
                f"forgetting.every_steps={every}",
                "forgetting.probe.gammas=[]",
                *extra,
            ]
            config = load_config(REPO / "configs/demo.yaml", overrides)
            current["loop"] = 0.0
            start = time.perf_counter()
            Run(config).execute()
            total = time.perf_counter() - start
            if record:
                timings.setdefault(f"{label} training", []).append(current["loop"])
                timings.setdefault(f"{label} run", []).append(total)

        run("warmup", True, record=False)  # fills the caches: pre-trained backbone, tokenisation, λ_p
        for _ in range(args.repeats):
            run("off", False)
            run("on", True)
    print(
        f"\nforgetting monitors, {args.method}, {args.steps} steps, defaults (every_steps={every}, no probe); "
        f"median of {args.repeats} alternating runs\n"
    )
    print("| | monitors off (s) | monitors on (s) | on ÷ off |")
    print("|---|---:|---:|---:|")
    for part in ("training", "run"):
        off, on = statistics.median(timings[f"off {part}"]), statistics.median(timings[f"on {part}"])
        print(f"| {part} | {off:.2f} | {on:.2f} | {on / off:.3f} |")
    off, on = statistics.median(timings["off training"]), statistics.median(timings["on training"])
    print(f"\nTarget training ratio ≤ 1.05: {'MET' if on / off <= 1.05 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
