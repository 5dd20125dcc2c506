"""The exact Pareto min-norm solver: w* = argmin_{w ≥ 0, Σw = 1} wᵀGw from the T×T Gram G alone, and its
floored variant (every w_t ≥ β/T, the collapse guard; see :func:`floored_vertex_gram`).

Why this is written by hand: LF-MLF solves this problem at *every* optimizer step, so it must be fast
(sub-millisecond at T = 48), exact (the certificate is part of the product: Theorem 2 is checked on the
returned point, and Pareto stationarity can end training), and total (a valid simplex vector for every finite
input, including duplicate, opposite and zero gradients and singular G). The general-purpose options do not
meet all three: cvxpy + Clarabel/OSQP/SCS cost milliseconds per call (see ``bench/solver.py``) and are
accurate to their tolerances (~1e-8 and looser), ``quadprog``-style dual active-set codes need a positive
definite G (ours is singular whenever gradients are dependent or T exceeds their rank), and the Frank–Wolfe
loops of MGDA implementations converge sublinearly without a certificate. No library we know of provides an
exact, fast, certified simplex-constrained min-norm solver working from the Gram alone.

Algorithm:

1. *Primal-dual active set* (Hintermüller, Ito & Kunisch 2002) from the full support, or the warm start's:
   on the support S solve the KKT system [[G_SS, 1], [1ᵀ, 0]] [w_S; ν] = [0; 1] with one LU solve
   (λ = -ν = wᵀGw), keep the positive weights and add the off-support t whose multiplier (Gw)_t − λ is
   negative; stop when both sets are feasible. Typically 1–6 solves at T = 48, hence few Python loops.
   If an LU pivot shows the KKT matrix singular (rank(G) < T − 1, duplicates, zero gradients), the pass is
   repeated on G + δI, δ = 1e-13 · max G_tt: every KKT matrix is then non-singular, and the optimum moves
   by at most δ in objective (round-off level); acceptance is always judged on G itself.
2. *Verification and fallback*: PDAS is a heuristic (it can thrash, typically on ill-conditioned G), so its
   result is accepted only when its Frank–Wolfe gap on G is at round-off level. Otherwise Wolfe's
   min-norm-point algorithm (1976) on the Gram runs: a primal active-set method, finite in exact
   arithmetic, whose corral stays affinely independent so its KKT matrices are non-singular; if round-off
   makes one singular anyway, the iterate slides along the zero-curvature direction (an affine dependence
   Σ p_t g_t = 0, Σ p_t = 0, which leaves d unchanged) until a weight reaches zero, and that point leaves
   the corral -- a singular matrix is never inverted. It first runs on G + δI from PDAS's best feasible
   iterate (cheap when there is one), and, if that does not verify, on G from the shortest vertex.
3. The returned w is clipped at 0 and renormalised, and the :class:`Certificate` is computed *from that w*.
4. With a floor β > 0 (weights restricted to Δ_β = {Σw = 1, w_t ≥ β/T}) the same steps run on the Gram of the
   points p_t = (1 − β)g_t + βḡ, whose min-norm point is the floored optimum (:func:`floored_vertex_gram`).

Everything runs on G / max_t G_tt (scale-free tolerances); objective values are reported in G's own units.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any, ContextManager, Optional

import numpy as np
from scipy.linalg.lapack import dgesv as _dgesv

_EPS = np.finfo(np.float64).eps
# Solves before the fast path gives up: successes need ≤ 8 on random problems up to T = 256; the thrashing
# seen on ill-conditioned G is better handed to Wolfe's method early.
_PDAS_MAX_ITER = 12
# Above this T, numpy/scipy's OpenBLAS would start threads for the LU solves; on a busy CPU (a training
# process beside us) that turns 0.5 ms into 80 ms, so the solve runs single-threaded (threadpoolctl).
_BLAS_LIMIT_T = 64
_BLAS: Any = None  # threadpoolctl's selection of scipy's OpenBLAS; False where unavailable; None: not looked up
# Optimality tolerance on the scaled problem (max diag = 1): a Frank–Wolfe gap below this is round-off.
_GAP_TOL = 1e-13
# Tikhonov shift of the fallback fast path (scaled units): keeps KKT matrices non-singular, costs ≤ δ.
_REG = 1e-13

Start = Optional[tuple[np.ndarray, np.ndarray]]  # a corral for Wolfe's method: (indices, positive weights)


class SolverInputError(ValueError):
    """The Gram matrix cannot be used (NaN/inf, wrong shape, empty, negative diagonal)."""


@dataclass(frozen=True)
class Certificate:
    """What the returned weights achieve, computed from them (not from the solver's internal state).

    With ``floor`` = β the feasible set is the floored simplex Δ_β = {w : Σw = 1, w_t ≥ β/T} (β = 0: the
    simplex of Mao et al. 2022, Problem 2).

    objective     wᵀGw = ||d||², d = Σ_t w_t g_t.
    fw_gap        the Frank–Wolfe gap of ½||d||² over Δ_β, max(0, wᵀGw − β·mean_t (Gw)_t − (1−β)·min_t (Gw)_t)
                  (the minimiser of a linear function over Δ_β is the vertex β/T·1 + (1−β)e_j): an upper
                  bound on ½(||d||² − ||d*_β||²). 0 at the exact optimum.
    kkt_residual  max over the free weights (w_t > β/T) of (1 − β)|(Gw)_t − λ| / max(1, max_t G_tt), λ the
                  multiplier of Σw = 1 (β = 0: λ = wᵀGw; β > 0: the mean of (Gw)_t over the free weights,
                  weighted by w_t − β/T). The factor 1 − β makes it the residual of the problem the solver
                  solves, in v = (w − β/T)/(1 − β) on the simplex, whose KKT condition is (1 − β)(Gw)_t + β·mean(Gw)
                  constant on the support: as β → 1 the free weights' share, and what they can get wrong, vanish.
    theorem2      min_t dᵀg_t − ||d||² = min_t (Gw)_t − wᵀGw. For β = 0, Theorem 2 of LF-MLF says ≥ 0 at the
                  optimum (every objective decreases along −d at least as fast as ||d||²), up to round-off. For
                  β > 0 there is no such guarantee: it is reported, and may be negative.
    min_d_dot_g   min_t dᵀg_t = min_t (Gw)_t: negative when −d increases some objective to first order
                  (possible only for β > 0).
    floor         β.
    iterations    KKT solves (fast path) plus Wolfe minor cycles (fallback), or the backend's count.
    backend       "exact", "exact+wolfe" (the fallback ran), "closed-form" or "cvxpy".
    seconds       wall time of the solve.
    """

    objective: float
    fw_gap: float
    kkt_residual: float
    theorem2: float
    min_d_dot_g: float
    floor: float
    iterations: int
    backend: str
    seconds: float

    def as_dict(self) -> dict[str, float]:
        """Numeric fields for logs (``backend`` is dropped: logs hold scalars)."""
        out = asdict(self)
        out.pop("backend")
        return {k: float(v) for k, v in out.items()}


def check_floor(floor: float) -> float:
    """``floor`` as a float in [0, 1]; raises ValueError for anything else (NaN, inf, a bool, a string)."""
    if isinstance(floor, bool) or not isinstance(floor, (int, float, np.integer, np.floating)):
        raise ValueError(f"floor must be a number in [0, 1], got {floor!r}")
    beta = float(floor)
    if not 0.0 <= beta <= 1.0:  # NaN fails this too
        raise ValueError(f"floor must be in [0, 1] (each weight is kept ≥ floor/T), got {beta}")
    return beta


def check_gram(gram: np.ndarray) -> np.ndarray:
    """Validated, symmetrised float64 copy of ``gram``; raises :class:`SolverInputError` when unusable."""
    try:
        g = np.asarray(gram, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise SolverInputError(f"gram is not a numeric array: {exc}") from exc
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise SolverInputError(f"gram must be a square 2-D matrix, got shape {g.shape}")
    if g.shape[0] == 0:
        raise SolverInputError("gram is empty (T = 0): there is no objective to weight")
    finite = np.isfinite(g)
    if not finite.all():
        bad = np.argwhere(~finite)
        raise SolverInputError(
            f"gram has NaN/inf entries: {len(bad)} of {g.size}, first at {tuple(int(i) for i in bad[0])} "
            f"= {g[tuple(bad[0])]}"
        )
    g = 0.5 * g + 0.5 * g.T  # not (g + gᵀ)/2: that overflows near the float64 maximum
    diag = np.diag(g)
    if diag.min() < -1e-10 * max(np.abs(g).max(), np.finfo(np.float64).tiny):
        t = int(diag.argmin())
        raise SolverInputError(f"gram is not positive semi-definite: G[{t},{t}] = {diag[t]} < 0")
    return g


def certify(
    gram: np.ndarray, w: np.ndarray, iterations: int, backend: str, seconds: float, floor: float = 0.0
) -> Certificate:
    """The :class:`Certificate` of weights ``w`` on the floored simplex Δ_floor for the (symmetric) ``gram``."""
    gw = gram @ w
    obj = float(w @ gw)
    low = float(gw.min())
    theorem2 = low - obj
    if floor == 0.0:
        fw_gap = max(-theorem2, 0.0)
        free, lam = w > 0, obj
    else:
        fw_gap = max(obj - floor * float(gw.mean()) - (1.0 - floor) * low, 0.0)
        excess = w - floor / len(w)
        free = excess > 0
        lam = float(excess[free] @ gw[free]) / float(excess[free].sum()) if free.any() else low
    kkt = float(np.abs(gw[free] - lam).max()) * (1.0 - floor) if free.any() else 0.0
    kkt /= max(1.0, float(np.diag(gram).max()))
    return Certificate(max(obj, 0.0), fw_gap, kkt, theorem2, low, floor, int(iterations), backend, seconds)


def to_simplex(w: np.ndarray) -> np.ndarray:
    """Clip round-off negatives and renormalise (the input is already a simplex vector up to round-off)."""
    w = np.clip(np.nan_to_num(w, nan=0.0), 0.0, None)
    s = w.sum()
    return w / s if s > 0 else np.full(len(w), 1.0 / len(w))


def solve_min_norm(
    gram: np.ndarray, *, floor: float = 0.0, backend: str = "exact", warm_start: Optional[np.ndarray] = None
) -> tuple[np.ndarray, Certificate]:
    """Pareto min-norm weights w* = argmin_{w ∈ Δ_β} wᵀGw and their :class:`Certificate`.

    ``gram`` is the T×T Gram of the objectives' gradients (symmetrised here). ``floor`` = β ∈ [0, 1] restricts
    the weights to the floored simplex Δ_β = {w : Σw = 1, w_t ≥ β/T}: β = 0 (default) is the simplex of LF-MLF,
    β = 1 leaves only the uniform weights (see :func:`floored_vertex_gram` for how β > 0 is solved).
    ``warm_start`` (weights of a previous, similar problem) only seeds the active set; the result does not
    depend on it beyond ties. ``backend="cvxpy"`` solves the same problem with Clarabel, as a reference. Raises
    :class:`SolverInputError` for NaN/inf, non-square or empty input, ValueError for a floor outside [0, 1].
    """
    start = time.perf_counter()
    g = check_gram(gram)
    beta = check_floor(floor)
    if backend == "cvxpy":
        from mtft.pareto.cvxpy_backend import solve_cvxpy

        w, iters = solve_cvxpy(g, floor=beta)
        return w, certify(g, w, iters, "cvxpy", time.perf_counter() - start, beta)
    if backend != "exact":
        raise ValueError(f"unknown backend {backend!r} (expected 'exact' or 'cvxpy')")
    if beta == 0.0:
        w, iters, name = _exact(g, warm_start)
        return w, certify(g, w, iters, name, time.perf_counter() - start)
    T = g.shape[0]
    scale = float(np.diag(g).max())
    if T == 1 or scale <= 0.0 or beta == 1.0:  # Δ_1 is the uniform weights; else every w is optimal
        w = np.full(T, 1.0 / T)
        return w, certify(g, w, 0, "closed-form", time.perf_counter() - start, beta)
    warm = None if warm_start is None else np.asarray(warm_start, dtype=np.float64).ravel() - beta / T
    v, iters, name = _exact(floored_vertex_gram(g / scale, beta), warm)
    w = beta / T + (1.0 - beta) * v  # ≥ β/T exactly (v ≥ 0); Σw = 1 up to round-off
    return w, certify(g, w, iters, name, time.perf_counter() - start, beta)


def floored_vertex_gram(gram: np.ndarray, floor: float) -> np.ndarray:
    """Gram of p_t = (1 − β) g_t + β ḡ (ḡ the mean gradient), the images of the vertices of Δ_β.

    The floored problem min_{w ∈ Δ_β} wᵀGw, written w = (β/T)·1 + (1 − β)v with v on the simplex, is the simplex
    QP with a linear term min_v (1−β)² vᵀGv + 2β(1−β) vᵀG1/T. On the simplex a linear term is a quadratic one
    (cᵀv = vᵀc1ᵀv) and a constant is too (1 = vᵀ11ᵀv), so the objective equals vᵀPv with
    P_ts = (1−β)² G_ts + β(1−β)(b_t + b_s) + β² ||ḡ||²,  b_t = g_tᵀḡ = (G1)_t/T,
    which is the Gram of the p_t: d = Σ_t w_t g_t = Σ_t v_t p_t. The floored problem is therefore the min-norm
    problem of the points p_t, and the exact solver applies unchanged (same certificate, no new algorithm);
    P is PSD by construction. Its conditioning degrades like ((1−β)/β)² as β → 1 (the p_t crowd around ḡ),
    which costs accuracy in v but not in d: errors in v enter w scaled by 1 − β.
    """
    T = gram.shape[0]
    b = gram.sum(axis=1) / T
    a = 1.0 - floor
    p = (a * a) * gram + (a * floor) * (b[:, None] + b[None, :]) + floor * floor * max(float(b.mean()), 0.0)
    np.fill_diagonal(p, np.maximum(np.diag(p), 0.0))  # ||p_t||² ≥ 0: only round-off can make it negative
    return p


def _exact(g: np.ndarray, warm_start: Optional[np.ndarray]) -> tuple[np.ndarray, int, str]:
    """The exact solver on a validated symmetric Gram: (simplex weights, iterations, method name)."""
    T = g.shape[0]
    scale = float(np.diag(g).max())
    if T == 1 or scale <= 0.0:  # one objective, or every gradient is zero: any w is optimal
        return np.full(T, 1.0 / T), 0, "closed-form"
    gn = g / scale
    if T == 2:
        w, iters, name = _two(gn), 0, "closed-form"
    else:
        with _single_thread_blas() if T > _BLAS_LIMIT_T else contextlib.nullcontext():
            w, iters, name = _solve_scaled(gn, warm_start)
        w = _drop_round_off_weights(gn, to_simplex(w))
    return to_simplex(w), iters, name


def _single_thread_blas() -> ContextManager[Any]:
    """Context limiting numpy's and scipy's OpenBLAS to one thread (a no-op without threadpoolctl)."""
    global _BLAS
    if _BLAS is None:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS = ThreadpoolController().select(prefix="libscipy_openblas")
        except Exception:  # threadpoolctl missing or unable to inspect this process: leave BLAS alone
            _BLAS = False
    return _BLAS.limit(limits=1) if _BLAS else contextlib.nullcontext()


def _drop_round_off_weights(g: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Zero the weights below 1e-10 of the largest when that lowers wᵀGw.

    Round-off-sized weights are harmless unless their gradients are many orders of magnitude longer than the
    others (then 1e-14 · ||g_big|| can dominate d): one matvec settles it.
    """
    small = (w > 0) & (w < 1e-10 * w.max())
    if not small.any():
        return w
    v = np.where(small, 0.0, w)
    v /= v.sum()
    return v if v @ g @ v < w @ g @ w else w


def _two(g: np.ndarray) -> np.ndarray:
    """Closed form for T = 2: minimise the quadratic in w_1 over [0, 1]."""
    den = g[0, 0] + g[1, 1] - 2.0 * g[0, 1]  # = ||g_1 − g_2||²
    tiny = 4.0 * _EPS * (g[0, 0] + g[1, 1])
    if den <= tiny:  # g_1 ≈ g_2 up to round-off: the shorter one if that is resolvable, else any w
        if abs(g[0, 0] - g[1, 1]) > tiny:
            return np.array([1.0, 0.0]) if g[0, 0] < g[1, 1] else np.array([0.0, 1.0])
        return np.array([0.5, 0.5])
    w1 = min(max((g[1, 1] - g[0, 1]) / den, 0.0), 1.0)
    return np.array([w1, 1.0 - w1])


def _solve_scaled(g: np.ndarray, warm_start: Optional[np.ndarray]) -> tuple[np.ndarray, int, str]:
    """PDAS (plain, then on G + δI), verified; then Wolfe's method (warm, then cold). max diag(g) = 1."""
    T = g.shape[0]
    support = np.ones(T, bool)
    if warm_start is not None:
        ws = np.asarray(warm_start, dtype=np.float64).ravel()
        if ws.shape == (T,) and np.isfinite(ws).all() and (ws > 0).any():
            support = ws > 0
    w, iters, _ = _pdas(g, support, 0.0)
    if w is not None:
        return w, iters, "exact"
    # Singular G (rank < T - 1, duplicates, zero gradients): G + δI makes every KKT matrix non-singular and
    # moves the optimum by at most δ·||w*||² ≤ δ in objective; the accepted gap is checked on G itself.
    w, more, start = _pdas(g, support, _REG)
    iters += more
    if w is not None:
        return w, iters, "exact"
    # PDAS thrashed (typically ill-conditioned G). Wolfe's method on G + δI -- the Gram of the lifted points
    # (g_t, sqrt(δ) e_t), which are linearly independent, so no corral is ever singular -- continues from
    # PDAS's best primal-feasible iterate: a few cycles instead of one per support point from a vertex.
    if start is not None:
        w, more = _wolfe(g + _REG * np.eye(T), start)
        iters += more
        gw = g @ w
        if w @ gw - gw.min() <= _GAP_TOL + 2.0 * _REG:
            return w, iters, "exact+wolfe"
    w, more = _wolfe(g)  # the exact, finite method from scratch
    return w, iters + more, "exact+wolfe"


def _kkt_matrix(g: np.ndarray, idx: np.ndarray, delta: float = 0.0) -> np.ndarray:
    """[[G_SS + δI, 1], [1ᵀ, 0]] for the support ``idx``."""
    k = len(idx)
    kkt = np.ones((k + 1, k + 1))
    kkt[:k, :k] = g if k == g.shape[0] else g.take(idx, 0).take(idx, 1)
    if delta:
        kkt.flat[: k * (k + 1) : k + 2] += delta
    kkt[k, k] = 0.0
    return kkt


def _kkt_solve(g: np.ndarray, idx: np.ndarray, delta: float) -> tuple[np.ndarray, float, bool]:
    """Affine minimiser on the support: w_S with (G_SS + δI) w_S = λ1, Σw_S = 1; returns (w_S, λ, singular).

    One LAPACK LU solve (dgesv: a third of ``np.linalg.solve``'s overhead at this size). ``singular`` flags a
    pivot below 1e-13 of the largest: a cheap detector of a numerically singular KKT matrix (it only decides
    which path to try next -- correctness comes from the final KKT check).
    """
    k = len(idx)
    rhs = np.zeros(k + 1)
    rhs[k] = 1.0
    lu, _, x, info = _dgesv(_kkt_matrix(g, idx, delta), rhs, overwrite_a=1, overwrite_b=1)
    piv = np.abs(lu.diagonal())
    singular = info != 0 or not piv.min() > 1e-13 * piv.max()
    return x[:k], -x[k], singular


def _pdas(g: np.ndarray, support: np.ndarray, delta: float) -> tuple[Optional[np.ndarray], int, Start]:
    """Primal-dual active set on G + δI from ``support``.

    Returns (w, solves, start): w when it settles on a support whose point passes the KKT check on G itself
    (Frank–Wolfe gap ≤ tolerance), else None (singular solve, cycling, or no convergence); ``start`` is the
    primal-feasible iterate (w_S ≥ 0) of lowest objective met on the way, to warm-start Wolfe's method.
    """
    T = g.shape[0]
    seen: set[bytes] = set()
    start, best = None, np.inf
    for it in range(1, _PDAS_MAX_ITER + 1):
        idx = np.flatnonzero(support)
        w_s, lam, singular = _kkt_solve(g, idx, delta)
        if (singular and not delta) or not np.abs(w_s).max() <= 1e12:  # singular: try G + δI / Wolfe
            return None, it, start
        gw = g[:, idx] @ w_s
        if delta:
            gw[idx] += delta * w_s
        new = np.zeros(T, bool)
        new[idx] = w_s > 0
        out = ~support
        new[out] = gw[out] < lam - _GAP_TOL  # a threshold, so that round-off multipliers do not churn
        feasible = w_s.min() >= -1e-15
        if feasible and not new[out].any():  # primal and dual feasible: the KKT point
            w = np.zeros(T)
            w[idx] = np.clip(w_s, 0.0, None)
            w /= w.sum()
            gw = g @ w
            ok = w @ gw - gw.min() <= _GAP_TOL + 2.0 * delta
            return (w if ok else None), it, start
        if feasible and lam < best:
            pos = w_s > 0
            start, best = (idx[pos], w_s[pos] / w_s[pos].sum()), lam
        key = new.tobytes()
        if key in seen or not new.any():  # cycling
            return None, it, start
        seen.add(key)
        support = new
    return None, _PDAS_MAX_ITER, start


def _wolfe(g: np.ndarray, start: Start = None) -> tuple[np.ndarray, int]:
    """Wolfe's min-norm-point algorithm on the Gram (the guaranteed, finite fallback); returns (w, cycles).

    Major cycle: add the vertex j minimising (Gw)_j when it improves (Frank–Wolfe gap > tolerance); minor
    cycles: move towards the affine minimiser of the corral and drop the points whose weight reaches 0.
    Exact arithmetic gives a strictly decreasing ||d|| and finitely many corrals; the objective guard
    stops the loop if round-off ever prevents progress. ``start`` (a corral and its positive weights, the
    affine minimiser of that corral) replaces the default start, the vertex of smallest norm.
    """
    T = g.shape[0]
    if start is None:
        corral, lam = [int(np.argmin(np.diag(g)))], np.array([1.0])
    else:
        corral, lam = [int(i) for i in start[0]], np.array(start[1], dtype=np.float64)
    iters, best = 0, np.inf
    for _ in range(10 * T + 10):
        gw = g[:, corral] @ lam
        obj = float(lam @ gw[corral])
        j = int(np.argmin(gw))
        if obj - gw[j] <= _GAP_TOL or j in corral or obj >= best:
            break
        best = obj
        saved = (list(corral), lam.copy())
        corral.append(j)
        lam = np.append(lam, 0.0)
        while len(corral) > 1:  # minor cycles
            iters += 1
            alpha = _affine_min(g, np.array(corral))
            if alpha is None:  # affinely dependent corral: slide along the dependence, d unchanged
                lam, corral = _slide(lam, _null_direction(g, np.array(corral)), corral)
                continue
            if alpha.min() > 0.0:
                lam = alpha
                break
            neg = alpha <= 0.0
            theta = float(np.min(lam[neg] / (lam[neg] - alpha[neg])))
            lam = lam + theta * (alpha - lam)
            keep = lam > 1e-15 * lam.max()
            if keep.all():  # round-off: force the blocking point out
                keep[int(np.argmin(np.where(neg, lam, np.inf)))] = False
            corral = [c for c, k in zip(corral, keep) if k]
            lam = lam[keep] / lam[keep].sum()
        if corral == saved[0]:  # j was dropped at once: no numerical progress possible
            corral, lam = saved
            break
    w = np.zeros(T)
    w[corral] = lam
    return w, iters


def _affine_min(g: np.ndarray, idx: np.ndarray) -> Optional[np.ndarray]:
    """Barycentric weights of the affine minimiser of the corral, or None when its KKT matrix is singular.

    Singularity shows as an LU failure or as an absurdly large solution (a well-posed affine minimiser of
    points of norm ≤ 1 has moderate barycentric weights unless the points are nearly affinely dependent).
    """
    w_s, _, singular = _kkt_solve(g, idx, 0.0)
    if singular or not np.abs(w_s).max() <= 1e10:
        return None
    return w_s


def _null_direction(g: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """A zero-curvature direction p (G_SS p ≈ 0, Σp = 0): the KKT matrix's eigenvector nearest 0.

    If K [p; ν] = 0 then pᵀG_SS p = -ν Σp = 0, so G_SS p = 0: Σ p_t g_t = 0 and d is unchanged along p.
    """
    vals, vecs = np.linalg.eigh(_kkt_matrix(g, idx))
    p = vecs[: len(idx), int(np.argmin(np.abs(vals)))]
    return p - p.mean()


def _slide(lam: np.ndarray, p: np.ndarray, corral: list[int]) -> tuple[np.ndarray, list[int]]:
    """Move λ along p (d does not change) until a weight reaches 0, and drop that point."""
    neg = p < 0
    if neg.any():
        theta = float(np.min(lam[neg] / -p[neg]))
        lam = lam + theta * p
        out = int(np.argmin(np.where(neg, lam, np.inf)))
    else:  # p ≈ 0 numerically (Σp = 0 makes this a zero vector): drop the smallest weight
        out = int(np.argmin(lam))
    keep = np.ones(len(lam), bool)
    keep[out] = False
    lam = np.clip(lam[keep], 0.0, None)
    total = lam.sum()
    lam = lam / total if total > 0 else np.full(len(lam), 1.0 / len(lam))
    return lam, [c for c, k in zip(corral, keep) if k]


def psd_factor(gram: np.ndarray) -> np.ndarray:
    """R with RᵀR = G (negative round-off eigenvalues clipped to 0): the factor of a Gram that is PSD only up to
    round-off, for the weightings and the cvxpy reference that need one."""
    vals, vecs = np.linalg.eigh(gram)
    return np.sqrt(np.clip(vals, 0.0, None))[:, None] * vecs.T
