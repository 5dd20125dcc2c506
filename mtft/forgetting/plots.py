"""PNG figures of a run (matplotlib, Agg backend): forgetting vs its bounds, sensitivity curves, the
Pareto-stationarity gauge, and the pre-training curves. Each returns the file it wrote, or None without data."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from mtft.reporting.figures import log_scale, plt, save_figure


def _key(name: str, group: str) -> str:
    return f"{name}/{group}" if group else name


DPI = 120


def plot_forgetting(events: list[dict[str, Any]], groups: list[str], path: Path) -> Optional[Path]:
    """Measured F_p, the second-order prediction and the two Theorem-1 bounds over steps, one panel per group."""
    measured = [e for e in events if e["kind"] == "forgetting"]
    tracked = [e for e in events if e["kind"] in ("displacement", "forgetting")]
    if not measured:
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(6.4 * len(groups), 4.4), squeeze=False)
    for ax, group in zip(axes[0], groups):
        steps = [e["step"] for e in tracked]
        ax.plot(
            steps,
            [e[_key("bound_path", group)] for e in tracked],
            color="tab:gray",
            ls="--",
            label="path bound (λ_p/2)·K·Σ||Δθ_k||²",
        )
        ax.plot(
            steps,
            [e[_key("bound_displacement", group)] for e in tracked],
            color="tab:blue",
            label="displacement bound (λ_p/2)·||θ−θ_p||²",
        )
        m_steps = [e["step"] for e in measured]
        ax.plot(
            m_steps,
            [e[_key("prediction", group)] for e in measured],
            color="tab:green",
            marker="s",
            ms=4,
            label="2nd-order prediction g_pᵀΔ+½ΔᵀHΔ (batch)",
        )
        ax.plot(
            m_steps,
            [e[_key("F_batch", group)] for e in measured],
            color="tab:olive",
            marker="^",
            ms=4,
            ls=":",
            label="measured F_p (prediction batch)",
        )
        ax.plot(
            m_steps,
            [e[_key("F_p", group)] for e in measured],
            color="black",
            marker="o",
            ms=4,
            label="measured F_p (held-out corpus)",
        )
        over = [e for e in measured if e.get(_key("exceeds_bound", group))]
        if over:
            ax.scatter(
                [e["step"] for e in over],
                [e[_key("F_p", group)] for e in over],
                s=80,
                facecolors="none",
                edgecolors="red",
                zorder=5,
                label="F_p above the bound",
            )
        log_scale(ax, "y", kind="symlog", linthresh=1e-4)
        ax.set_xlabel("step")
        ax.set_ylabel("rise of L_p (nats)")
        ax.set_title(f"Forgetting vs Theorem 1{' — ' + group if group else ''}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path, DPI)


def plot_sensitivity(rows: list[dict[str, Any]], languages: list[str], path: Path) -> Optional[Path]:
    """ΔL_p against γ (log scale) with the spread over seeds: averaged over languages, and per language."""
    if not rows:
        return None
    models = list(dict.fromkeys(r["model"] for r in rows))
    panels = ["mean", *languages]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels):
        for model in models:
            mine = sorted((r for r in rows if r["model"] == model), key=lambda r: r["gamma"])
            ax.errorbar(
                [r["gamma"] for r in mine],
                [r[f"dlp/{panel}/mean"] for r in mine],
                yerr=[r[f"dlp/{panel}/std"] for r in mine],
                marker="o",
                ms=4,
                capsize=3,
                label=model,
            )
        log_scale(ax, "x")
        ax.set_xlabel("γ (noise std / init std)")
        ax.set_title("mean over languages" if panel == "mean" else panel)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("ΔL_p (mean ± std over seeds)")
    axes[0][0].legend(fontsize=7)
    return save_figure(fig, path, DPI)


def plot_stationarity(events: list[dict[str, Any]], path: Path) -> Optional[Path]:
    """LF-MLF's Pareto-stationarity gauge ||d||²/mean_t||g_t||² (0 at a Pareto-stationary point) per step."""
    steps = [e for e in events if e["kind"] == "weighting" and e.get("stationarity") is not None]
    if not steps:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot([e["step"] for e in steps], [max(e["stationarity"], 1e-12) for e in steps], lw=0.8)
    log_scale(ax, "y")
    ax.set_xlabel("step")
    ax.set_ylabel("||d||² / mean_t ||g_t||²")
    ax.set_title("Pareto-stationarity gauge (LF-MLF)")
    ax.grid(alpha=0.3)
    return save_figure(fig, path, DPI)


def plot_pretrain(events: list[dict[str, Any]], path: Path) -> Optional[Path]:
    """Pre-training loss against tokens, and L_p per language at each saved budget."""
    train = [e for e in events if e["kind"] == "pretrain"]
    budgets = [e for e in events if e["kind"] == "budget"]
    if not train:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot(
        [e["tokens"] for e in train],
        [e["loss"] for e in train],
        color="tab:gray",
        lw=0.8,
        label="training loss (masked-LM)",
    )
    languages = sorted({k.removeprefix("lp/") for e in budgets for k in e if k.startswith("lp/")})
    for lang in languages:
        ax.plot(
            [e["tokens_seen"] for e in budgets],
            [e[f"lp/{lang}"] for e in budgets],
            marker="o",
            ms=4,
            label=f"held-out L_p {lang}",
        )
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats)")
    ax.set_title("Masked-LM pre-training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path, DPI)
