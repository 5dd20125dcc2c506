"""λ_p and the second-order prediction: exact Hessian-vector products of L_p over a fixed batch.

``LpObjective`` is L_p on a fixed batch as a function of a chosen subset of the masked-LM's parameters (the
ones fine-tuning moves), evaluated at a given point (θ_p) through ``torch.func.functional_call``: the point's
tensors become fresh leaves that share storage with the weights (no copy), so neither the model's ``.grad``
nor its hooks are touched. H·v is the gradient of ⟨∇L, v⟩ (double backward, one batch at a time so only one
batch's graph is alive), in eval mode and with eager attention.

λ_p is the largest eigenvalue, by Lanczos (the default; restarted, with full re-orthogonalisation) or by power
iteration (shifted when the dominant eigenvalue is negative, since Theorem 1 needs the largest, not the largest in
magnitude) on the same products, never more than ``forgetting.eigen_iterations`` of them. The estimate is a
Rayleigh quotient, hence never above the true top eigenvalue of the batch
Hessian; convergence is reported as the residual ||Hv − λv|| / |λ| (some eigenvalue lies within it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Optional

import numpy as np
import torch

from mtft.forgetting.mlm import EncoderLoss, eager_attention, evaluating

Vector = list[torch.Tensor]
KRYLOV = 20  # basis vectors per Lanczos cycle (as ARPACK's default ncv for one eigenvalue)


def dot(a: Vector, b: Vector) -> float:
    return float(sum(torch.vdot(x.reshape(-1), y.reshape(-1)).double() for x, y in zip(a, b)))


def norm(a: Vector) -> float:
    return dot(a, a) ** 0.5


@dataclass
class EigenResult:
    value: float
    method: str
    products: int  # Hessian-vector products spent
    residual: float  # ||Hv − λv|| / |λ| of the returned pair
    converged: bool
    history: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class LpObjective:
    """L_p(θ) = mean over languages of the per-language mean masked-LM loss, on fixed ``batches``."""

    def __init__(
        self,
        mlm: EncoderLoss,
        names: list[str],
        batches: Mapping[str, list[dict[str, torch.Tensor]]],
        device,
        fixed: Optional[dict[str, torch.Tensor]] = None,
    ):
        self.mlm, self.names, self.device = mlm, names, device
        self.batches = {lang: [{k: v.to(device) for k, v in b.items()} for b in bs] for lang, bs in batches.items()}
        self.fixed = fixed or {}
        counts = {lang: sum(mlm.targets(b) for b in bs) for lang, bs in self.batches.items()}
        # each batch's loss sum enters L_p with this weight
        self.scale = {lang: 1.0 / (counts[lang] * len(self.batches)) for lang in self.batches}

    def _each_batch(self, point: Mapping[str, torch.Tensor], fn: Callable) -> None:
        params = {**self.fixed, **point}
        with evaluating(self.mlm), eager_attention(self.mlm.encoder):
            for lang, batches in self.batches.items():
                for batch in batches:
                    loss_sum, _ = torch.func.functional_call(self.mlm, params, args=(), kwargs=batch)
                    fn(loss_sum * self.scale[lang])

    def leaves(self, point: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: point[n].detach().requires_grad_(True) for n in self.names}

    def value(self, point: Mapping[str, torch.Tensor]) -> float:
        total = [0.0]

        def add(loss):
            total[0] += float(loss.detach().double())

        with torch.no_grad():
            self._each_batch({n: point[n] for n in self.names}, add)
        return total[0]

    def gradient(self, point: Mapping[str, torch.Tensor]) -> tuple[float, Vector]:
        leaves = self.leaves(point)
        grads = [torch.zeros_like(x) for x in leaves.values()]
        total = [0.0]

        def add(loss):
            total[0] += float(loss.detach().double())
            for g, d in zip(grads, torch.autograd.grad(loss, list(leaves.values()))):
                g.add_(d)

        self._each_batch(leaves, add)
        return total[0], grads

    def hvp(self, point: Mapping[str, torch.Tensor], vector: Vector) -> tuple[float, Vector, Vector]:
        """(L, ∇L, H·vector) at ``point``: one double-backward pass per batch."""
        leaves = self.leaves(point)
        params = list(leaves.values())
        grads = [torch.zeros_like(x) for x in params]
        products = [torch.zeros_like(x) for x in params]
        total = [0.0]

        def add(loss):
            total[0] += float(loss.detach().double())
            # A parameter the loss does not reach (e.g. another task's LoRA adapter: the MLM rows are routed to one)
            # has a zero gradient and zero Hessian rows, hence allow_unused and the skips below.
            first = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
            inner = sum((g * v).sum() for g, v in zip(first, vector) if g is not None)
            for acc, g in zip(grads, first):
                if g is not None:
                    acc.add_(g.detach())
            if not torch.is_tensor(inner) or not inner.requires_grad:
                return
            for acc, hv in zip(products, torch.autograd.grad(inner, params, allow_unused=True)):
                if hv is not None:
                    acc.add_(hv)

        self._each_batch(leaves, add)
        return total[0], grads, products

    def second_order(self, point: Mapping[str, torch.Tensor], delta: Vector) -> dict[str, float]:
        """g_pᵀΔ + ½ ΔᵀH_pΔ at ``point`` (= θ_p) with one Hessian-vector product."""
        loss, grad, product = self.hvp(point, delta)
        linear, quadratic = dot(grad, delta), 0.5 * dot(delta, product)
        return {
            "loss": loss,
            "linear": linear,
            "quadratic": quadratic,
            "prediction": linear + quadratic,
            "grad_norm": norm(grad),
        }

    def random_vector(self, point: Mapping[str, torch.Tensor], seed: int) -> Vector:
        generator = torch.Generator().manual_seed(seed)
        return [torch.randn(point[n].shape, generator=generator, dtype=torch.float32).to(point[n]) for n in self.names]


def power_iteration(matvec: Callable[[Vector], Vector], start: Vector, iterations: int, tol: float) -> EigenResult:
    """Largest eigenvalue (algebraic) of a symmetric operator given by ``matvec``."""
    first = _power(matvec, start, iterations, tol, shift=0.0)
    if first.value >= 0 or first.products >= iterations:
        return first
    # The dominant eigenvalue is negative: the top one is found on H − λ_neg·I, whose eigenvalues are ≥ 0.
    shifted = _power(matvec, start, iterations - first.products, tol, shift=first.value)
    shifted.products += first.products
    return shifted


def _power(matvec, start: Vector, iterations: int, tol: float, shift: float) -> EigenResult:
    v = [x / norm(start) for x in start]
    history: list[float] = []
    value, residual = 0.0, float("inf")
    for k in range(1, iterations + 1):
        w = matvec(v)
        if shift:
            w = [a - shift * b for a, b in zip(w, v)]
        value = dot(v, w)
        residual = norm([a - value * b for a, b in zip(w, v)]) / max(abs(value + shift), 1e-30)
        history.append(value + shift)
        if residual <= tol:
            return EigenResult(value + shift, "power", k, residual, True, history)
        size = norm(w)
        if size == 0:  # v lies in the null space: every eigenvalue seen is 0
            return EigenResult(shift, "power", k, 0.0, True, history)
        v = [x / size for x in w]
    return EigenResult(value + shift, "power", iterations, residual, False, history)


def lanczos(matvec: Callable[[Vector], Vector], start: Vector, iterations: int, tol: float) -> EigenResult:
    """Largest eigenvalue by Lanczos, restarted from the Ritz vector every :data:`KRYLOV` products.

    Written here rather than calling scipy's ARPACK (``eigsh``): ARPACK overshoots a small product budget (7
    products for a budget of 4, 31 for 30) and, when it has not converged by then, returns no estimate at all,
    while ``forgetting.eigen_iterations`` is a hard budget of Hessian-vector products (each one a double backward
    over the held-out batch) and a run wants the best estimate found. Each cycle builds a Krylov basis with full
    re-orthogonalisation (every basis vector kept, float64, as ARPACK keeps its ``ncv`` vectors) and takes the top
    eigenpair of the tridiagonal matrix; the residual ||Hy − θy|| = β_m·|s_m| comes from the recurrence, without an
    extra product. The Ritz value is a Rayleigh quotient, never above the true top eigenvalue."""
    shapes = [x.shape for x in start]
    sizes = [x.numel() for x in start]

    def apply(flat: np.ndarray) -> np.ndarray:
        parts = np.split(flat, np.cumsum(sizes)[:-1])
        vector = [torch.from_numpy(p.astype(np.float32)).reshape(s).to(t) for p, s, t in zip(parts, shapes, start)]
        return np.concatenate([x.detach().double().cpu().reshape(-1).numpy() for x in matvec(vector)])

    v = np.concatenate([x.detach().double().cpu().reshape(-1).numpy() for x in start])
    v /= np.linalg.norm(v)
    value, residual, used, converged = float("nan"), float("inf"), 0, False
    history: list[float] = []
    while used < iterations and not converged:
        steps = min(KRYLOV, iterations - used)
        basis = np.empty((steps, v.size))  # filled row by row: no copy of the basis per product
        basis[0] = v
        alphas: list[float] = []
        betas: list[float] = []
        beta = 0.0
        for j in range(steps):
            w = apply(basis[j])
            used += 1
            alphas.append(float(basis[j] @ w))
            for _ in range(2):  # full re-orthogonalisation, twice ("twice is enough", Parlett)
                w -= basis[: j + 1].T @ (basis[: j + 1] @ w)
            beta = float(np.linalg.norm(w))
            if beta <= 1e-12 * max(abs(alphas[-1]), 1e-30):  # an invariant subspace: the Ritz values are exact
                beta = 0.0
                break
            if j + 1 < steps:
                betas.append(beta)
                basis[j + 1] = w / beta
        ritz_values, ritz_vectors = np.linalg.eigh(_tridiagonal(alphas, betas))
        value, s = float(ritz_values[-1]), ritz_vectors[:, -1]
        residual = beta * abs(float(s[-1])) / max(abs(value), 1e-30)
        history.append(value)
        converged = residual <= tol
        v = basis[: len(alphas)].T @ s
        v /= np.linalg.norm(v)
    return EigenResult(value, "lanczos", used, residual, converged, history)


def _tridiagonal(alphas: list[float], betas: list[float]) -> np.ndarray:
    return np.diag(alphas) + np.diag(betas, 1) + np.diag(betas, -1)


def top_eigenvalue(matvec, start: Vector, method: str, iterations: int, tol: float) -> EigenResult:
    return (lanczos if method == "lanczos" else power_iteration)(matvec, start, iterations, tol)
