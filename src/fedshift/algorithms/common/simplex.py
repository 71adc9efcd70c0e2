"""Weights on the probability simplex Δ = {a ≥ 0, Σ a = 1}: Euclidean projection (DRFA's
λ step) and the convex quadratic program min_{a ∈ Δ} aᵀPa (FedPAC's classifier weights),
solved with SciPy's SLSQP."""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import minimize
from torch import Tensor


def project_simplex(v: Tensor) -> Tensor:
    """argmin_{a ∈ Δ} ‖a − v‖² by the sort-and-threshold rule (Duchi et al., ICML 2008)."""
    u, _ = torch.sort(v, descending=True)
    css = torch.cumsum(u, 0) - 1.0
    k = torch.arange(1, v.numel() + 1, dtype=v.dtype, device=v.device)
    rho = int(torch.nonzero(u - css / k > 0).max())
    theta = css[rho] / (rho + 1)
    return torch.clamp(v - theta, min=0.0)


def simplex_qp(p: np.ndarray) -> np.ndarray:
    """argmin_{a ∈ Δ} aᵀ P a for a symmetric positive semi-definite ``p`` (SciPy SLSQP)."""
    p = 0.5 * (np.asarray(p, dtype=np.float64) + np.asarray(p, dtype=np.float64).T)
    m = p.shape[0]
    scale = max(float(np.abs(p).max()), 1e-30)  # conditioning: the minimiser is scale-free
    q = p / scale
    res = minimize(
        lambda a: float(a @ q @ a),
        np.full(m, 1.0 / m),
        jac=lambda a: 2.0 * q @ a,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0, "jac": lambda a: np.ones(m)}],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    a = np.clip(res.x, 0.0, None)
    return a / a.sum()
