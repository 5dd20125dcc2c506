"""The training curves every run's report shows: each objective's training loss per logged step and, when the run
was evaluated more than once, each task's macro metrics per evaluation (sources, targets and the transfer gap
where the run has targets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from mtft.reporting.figures import plt, save_figure

DPI = 110
FILE = "training_curves.png"


def plot_training_curves(events: list[dict[str, Any]], path: Path) -> Optional[Path]:
    train = [e for e in events if e["kind"] == "train"]
    if not train:
        return None
    objectives = sorted(k for k in train[0] if k.startswith("loss/"))
    evaluated = [e for e in events if e["kind"] in ("eval", "dev")]
    metrics = sorted(
        {k for e in evaluated for k in e if k.count("/") == 1 and "majority_" not in k and isinstance(e[k], float)}
    )
    panels = 2 if len({e["step"] for e in evaluated}) >= 2 and metrics else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.4 * panels, 3.8), squeeze=False)
    loss = axes[0][0]
    steps = [e["step"] for e in train]
    loss.plot(steps, [e["loss"] for e in train], color="black", lw=1.2, label="combined")
    for key in objectives:  # an objective without rows in a logged window has no value there
        points = [(e["step"], e[key]) for e in train if e.get(key) is not None]
        loss.plot([s for s, _ in points], [v for _, v in points], lw=0.8, label=key.removeprefix("loss/"))
    loss.set_xlabel("step")
    loss.set_ylabel("training loss")
    loss.set_title("Training loss per objective")
    loss.grid(alpha=0.3)
    loss.legend(fontsize=7, ncol=2)
    if panels == 2:
        scores = axes[0][1]
        for key in metrics:
            points = [(e["step"], e[key]) for e in evaluated if isinstance(e.get(key), float)]
            scores.plot([s for s, _ in points], [v for _, v in points], marker="o", ms=3, lw=0.8, label=key)
        scores.set_xlabel("step")
        scores.set_title("Evaluation per task (macro over languages)")
        scores.grid(alpha=0.3)
        scores.legend(fontsize=7)
    return save_figure(fig, path, DPI)
