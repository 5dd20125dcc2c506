"""Benchmark of the Pareto min-norm solver against cvxpy/Clarabel, measured side by side in one run.

    python bench/solver.py [--problems 40] [--percall 8] [--seed 0]

For T = 2, 15, 48, 100 and random gradients g_t ∈ R^n (Gram A Aᵀ; n = 2T, so G is full rank, as it is for
real gradients with millions of shared parameters), prints a Markdown table: median wall time of
``solve_min_norm`` (exact), of the cvxpy backend with the problem built once with Parameters
(``cvxpy_problem(T)``, the DPP-compiled problem is reused), and of cvxpy with the problem built per call; the
ratios cvxpy ÷ ours; the largest relative objective gap (ours − cvxpy)/cvxpy; and whether the targets hold
(median ≤ 0.5 ms at T = 48; objective within 1e-9 relative of cvxpy's). A second table repeats the exact
solver's timings on degenerate families (rank-deficient, ill-conditioned), where the fast path can fall back
to Wolfe's method. A third table times the floored solver (the collapse guard, weights ≥ β/T; β = 0.1 and 0.5)
beside the unfloored one on the same problems, with the ratios floored ÷ unfloored, its objective gap to
cvxpy's floored problem, and the same 0.5 ms target at T = 48. Timings interleave the methods problem by
problem, so machine load hits them alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtft.pareto import check_gram, cvxpy_floored_problem, cvxpy_problem, solve_min_norm  # noqa: E402
from mtft.pareto.cvxpy_backend import _build, solve_cvxpy  # noqa: E402

SIZES = (2, 15, 48, 100)
FLOORS = (0.1, 0.5)
TARGET_MS_T48 = 0.5
TARGET_REL_GAP = 1e-9


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def _random(rng: np.random.Generator, T: int) -> np.ndarray:
    a = rng.standard_normal((T, 2 * T))
    return a @ a.T


def _rank_deficient(rng: np.random.Generator, T: int) -> np.ndarray:
    a = rng.standard_normal((T, max(1, T // 2)))
    return a @ a.T


def _ill_conditioned(rng: np.random.Generator, T: int) -> np.ndarray:
    u, _ = np.linalg.qr(rng.standard_normal((T, T)))
    v, _ = np.linalg.qr(rng.standard_normal((2 * T, T)))
    a = (u * np.logspace(-8, 0, T)) @ v.T
    return a @ a.T


def _per_call(gram: np.ndarray) -> np.ndarray:
    g = check_gram(gram)
    w, _ = solve_cvxpy(g, problem=_build(len(g)))
    return w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=40, help="problems per T (ours and cvxpy-param)")
    parser.add_argument("--percall", type=int, default=8, help="problems per T for cvxpy built per call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)

    rows, ok_time, ok_gap = [], True, True
    for T in SIZES:
        cvxpy_problem(T)  # compile once, outside the timings (that is what "built once" means)
        solve_min_norm(_random(rng, T), backend="cvxpy")
        ours, param, percall, gaps = [], [], [], []
        for k in range(args.problems):
            gram = _random(rng, T)
            (w, cert), t_ours = _timed(solve_min_norm, gram)
            (_, ref), t_param = _timed(solve_min_norm, gram, backend="cvxpy")
            ours.append(t_ours)
            param.append(t_param)
            gaps.append((cert.objective - ref.objective) / ref.objective)
            if k < args.percall:
                percall.append(_timed(_per_call, gram)[1])
        m_ours, m_param, m_call = (float(np.median(x)) * 1e3 for x in (ours, param, percall))
        gap = max(gaps)
        ok_gap &= gap <= TARGET_REL_GAP
        if T == 48:
            ok_time = m_ours <= TARGET_MS_T48
        rows.append(
            f"| {T} | {m_ours:.3f} | {m_param:.2f} | {m_call:.1f} | {m_param / m_ours:.0f}× "
            f"| {m_call / m_ours:.0f}× | {gap:.1e} |"
        )

    print(
        f"Random problems, g_t ∈ R^(2T) (seed {args.seed}; {args.problems} problems per T, "
        f"{args.percall} for cvxpy built per call)\n"
    )
    print(
        "| T | ours (ms) | cvxpy, built once (ms) | cvxpy, built per call (ms) | ratio built once ÷ ours "
        "| ratio per call ÷ ours | max (ours − cvxpy)/cvxpy |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nTarget median ≤ {TARGET_MS_T48} ms at T = 48: {'MET' if ok_time else 'NOT MET'}")
    print(
        f"Target objective within {TARGET_REL_GAP:g} relative of cvxpy's (never worse): "
        f"{'MET' if ok_gap else 'NOT MET'}"
    )

    print("\nDegenerate families, exact solver only (median / max ms; fraction that fell back to Wolfe)\n")
    print("| T | rank-deficient (n = T/2) | fallback | ill-conditioned (σ 1e-8..1) | fallback |")
    print("|---|---|---|---|---|")
    for T in SIZES[1:]:
        cells = []
        for make in (_rank_deficient, _ill_conditioned):
            times, falls = [], 0
            for _ in range(args.problems):
                (_, cert), t = _timed(solve_min_norm, make(rng, T))
                times.append(t)
                falls += cert.backend == "exact+wolfe"
            cells.append(f"{np.median(times) * 1e3:.3f} / {max(times) * 1e3:.2f} | {falls / args.problems:.0%}")
        print(f"| {T} | " + " | ".join(cells) + " |")

    floored_table(rng, args.problems)


def floored_table(rng: np.random.Generator, problems: int) -> None:
    """The floored solver beside the unfloored one (same problems, interleaved) and against cvxpy's floored QP."""
    print(
        f"\nFloored simplex (collapse guard, w_t ≥ β/T), random problems as above; median ms over {problems} "
        "problems per T; gap: max (ours − cvxpy)/cvxpy over the floored problems\n"
    )
    head = " | ".join(f"β = {b} (ms) | ratio β = {b} ÷ β = 0 | gap β = {b}" for b in FLOORS)
    print(f"| T | β = 0 (ms) | {head} |")
    print("|---|---|" + "---|---|---|" * len(FLOORS))
    ok_time, ok_gap = True, True
    for T in SIZES:
        cvxpy_floored_problem(T)
        solve_min_norm(_random(rng, T), floor=FLOORS[0], backend="cvxpy")  # compile outside the timings
        times: dict[float, list[float]] = {b: [] for b in (0.0, *FLOORS)}
        gaps: dict[float, list[float]] = {b: [] for b in FLOORS}
        for _ in range(problems):
            gram = _random(rng, T)
            for b in times:
                (_, cert), t = _timed(solve_min_norm, gram, floor=b)
                times[b].append(t)
                if b > 0:
                    _, ref = solve_min_norm(gram, floor=b, backend="cvxpy")
                    gaps[b].append((cert.objective - ref.objective) / ref.objective)
        med = {b: float(np.median(x)) * 1e3 for b, x in times.items()}
        cells = " | ".join(f"{med[b]:.3f} | {med[b] / med[0.0]:.2f}× | {max(gaps[b]):.1e}" for b in FLOORS)
        print(f"| {T} | {med[0.0]:.3f} | {cells} |")
        ok_gap &= all(max(gaps[b]) <= TARGET_REL_GAP for b in FLOORS)
        if T == 48:
            ok_time = all(med[b] <= TARGET_MS_T48 for b in FLOORS)
    print(
        f"\nTarget floored median ≤ {TARGET_MS_T48} ms at T = 48 (β = {', '.join(map(str, FLOORS))}): "
        f"{'MET' if ok_time else 'NOT MET'}"
    )
    print(
        f"Target floored objective within {TARGET_REL_GAP:g} relative of cvxpy's (never worse): "
        f"{'MET' if ok_gap else 'NOT MET'}"
    )


if __name__ == "__main__":
    main()
