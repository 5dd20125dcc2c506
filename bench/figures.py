"""What a run's log-axis figure costs with matplotlib's mathtext labels and with mtft's text labels, side by side.

    python bench/figures.py              # 7 fresh processes of each, interleaved
    python bench/figures.py --repeats 11

Every short LF-MLF run draws its Pareto-stationarity gauge on a log axis (mtft/forgetting/plots.py). matplotlib labels a
log axis in mathtext, and the first such label of a process builds the mathtext parser (pyparsing), then parses every
new label; mtft/reporting/figures.py writes the same labels as Unicode text. Each sample is a fresh process (the
cost that matters is the first figure of a run's process), one thread, the libraries imported before the clock
starts (torch, transformers and datasets too: a run's heap, which the garbage collector walks meanwhile); the
figure is the gauge of a 12-step run over one decade (as in a short run, where matplotlib labels minor ticks too)
and over four. Prints the median and the fastest of each, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# one figure in a fresh process: the gauge, labelled by matplotlib ("mathtext") or by mtft ("text")
PROGRAM = """
import json, sys, time
import torch, transformers, datasets  # a run's heap: what the garbage collector walks while the figure is drawn
from mtft.forgetting import plots

labels, decay, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
if labels == "mathtext":  # matplotlib's own formatters: the scale as set, nothing replaced
    plots.log_scale = lambda ax, axis="y", kind="log", **scale: (ax.set_xscale if axis == "x" else ax.set_yscale)(
        kind, **scale
    )
events = [{"kind": "weighting", "step": s, "stationarity": 0.3 * decay**s * (1 + 0.5 * (s % 3))} for s in range(1, 13)]
start = time.perf_counter()
plots.plot_stationarity(events, out)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


#: the gauge's range: within about a decade (a short run: matplotlib labels the minor ticks too), and four decades
RANGES = {"one decade": 0.9, "four decades": 0.45}


def one(labels: str, decay: float, folder: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = folder / f"{labels}.png"
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM, labels, str(decay), str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    samples: dict[tuple[str, str], list[float]] = {
        (span, labels): [] for span in RANGES for labels in ("mathtext", "text")
    }
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeats):
            for span, labels in samples:  # interleaved: the machine's drift falls on all
                samples[span, labels].append(one(labels, RANGES[span], Path(folder)))
    medians = {key: statistics.median(values) for key, values in samples.items()}
    print(
        "| the gauge's range | mathtext labels: median (min) | text labels: median (min) | text ÷ mathtext, medians |"
        "\n|---|---:|---:|---:|"
    )
    for span in RANGES:
        mathtext, text = samples[span, "mathtext"], samples[span, "text"]
        print(
            f"| {span} | {medians[span, 'mathtext'] * 1000:.0f} ms ({min(mathtext) * 1000:.0f}) | "
            f"{medians[span, 'text'] * 1000:.0f} ms ({min(text) * 1000:.0f}) | "
            f"{medians[span, 'text'] / medians[span, 'mathtext']:.2f}x |"
        )
    print(f"\n{args.repeats} fresh processes each, interleaved (the first figure of a process, one thread)")


if __name__ == "__main__":
    main()
