"""The Pareto min-norm problem of LF-MLF (Mao et al. 2022, Problem 2): exact solver, certificate, cvxpy reference.

w, cert = solve_min_norm(gram)            # w ≥ 0, Σw = 1, minimising wᵀGw; cert.theorem2 ≥ 0 at the optimum
w, cert = solve_min_norm(gram, backend="cvxpy")   # the same problem through cvxpy/Clarabel
w, cert = solve_min_norm(gram, floor=0.1)         # every w_t ≥ 0.1/T: the collapse guard (floored simplex)
"""

from mtft.pareto.cvxpy_backend import cvxpy_floored_problem, cvxpy_problem
from mtft.pareto.solver import (
    Certificate,
    SolverInputError,
    certify,
    check_floor,
    check_gram,
    floored_vertex_gram,
    solve_min_norm,
    to_simplex,
)

__all__ = [
    "Certificate",
    "SolverInputError",
    "certify",
    "check_floor",
    "check_gram",
    "cvxpy_floored_problem",
    "cvxpy_problem",
    "floored_vertex_gram",
    "solve_min_norm",
    "to_simplex",
]
