"""The Gaussian probe of the overtraining study's pre-trained models alone: ΔL_p(γ) of θ_p per budget and its rank
correlation with the budget, without the study's 144 fine-tuning runs (docs/overtraining.md).

    python bench/overtraining_probe.py --cache DIR [--figure docs/figures/overtraining/b_probe.png]

``DIR`` is a ``data.cache_dir`` holding the study's backbones (``pretrained/<key>/`` with its ``pretrain.json``),
filled by the study itself or by one short run per (budget, seed) of ``configs/overtraining.yaml``
(``pretrain.tokens=<budget> pretrain.seed=<seed> run.seed=<seed> training.max_steps=1 forgetting.enabled=false
data.cache_dir=DIR``). Each backbone is probed by ``run.py probe`` as the study's runs probe θ_p (γ = 0.3, 1, 3; 3
noise seeds; the 64 held-out texts of ``corpus.max_eval_examples``); the table, the Spearman ρ and figure (b) are
the study's own analysis code (:mod:`mtft.study.overtraining`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
AXIS = "pretrain.tokens"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, required=True, help="the data.cache_dir holding the backbones")
    parser.add_argument("--figure", type=Path, default=None, help="where to draw figure (b)")
    args = parser.parse_args()
    from mtft.commands.probe import build_parser
    from mtft.commands.probe import main as probe
    from mtft.study.overtraining import _curve, _per_budget, sensitivity_trends, trend_section

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, meta in enumerate(sorted((args.cache / "pretrained").glob("*/pretrain.json"))):
            info = json.loads(meta.read_text())
            out = Path(tmp) / str(index)
            argv = ["--checkpoint", str(meta.parent), "--gamma", "0.3,1,3", "--max-examples", "64", "--out", str(out)]
            probe(build_parser().parse_args(argv))
            [result] = json.loads((out / "probe.json").read_text())
            metrics = {f"dlp_pretrained/g{row['gamma']:g}": row["dlp/mean/mean"] for row in result["summary"]}
            metrics["pretrain_seed"] = info["seed"]
            records.append({"axes": {AXIS: info["tokens_budget"]}, "metrics": metrics})
    gammas = ["dlp_pretrained/g0.3", "dlp_pretrained/g1", "dlp_pretrained/g3"]
    curves = [_curve(records, AXIS, key) for key in gammas]
    print("| budget (tokens) | models | " + " | ".join(f"ΔL_p(θ_p), γ={k.split('/g')[1]}" for k in gammas) + " |")
    print("|---:|---:|" + "---:|" * len(gammas))
    for i, budget in enumerate(curves[0][0]):
        models = sum(1 for r in records if r["axes"][AXIS] == budget)
        cells = [f"{means[i]:.4f} ± {stds[i]:.4f}" for _, means, stds in curves]
        print(f"| {budget:,.0f} | {models} | " + " | ".join(cells) + " |")
    print("\n".join(trend_section(sensitivity_trends(records, AXIS))))
    if args.figure:
        _per_budget(records, AXIS, gammas, args.figure, "ΔL_p of θ_p under Gaussian noise")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
