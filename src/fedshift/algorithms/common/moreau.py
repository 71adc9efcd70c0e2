"""The bi-level local iteration of pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020, Alg. 1) that
CGPFL (thesis ch. 3, Alg. 1 lines 5–10) reuses: a personalized model θ is pulled towards a
local copy ω̃ of a server model by the Moreau-envelope objective

    F(θ; ω̃) = R(θ) + (λ/2)·‖θ − ω̃‖²,

For r = 1..R local iterations, one minibatch D_r is drawn; θ takes S gradient steps on
F(θ; ω̃) over D_r (lr η), then ω̃ ← ω̃ − β·c·(ω̃ − θ), a gradient step on a regulariser in
ω̃ with weight c = ``omega_weight``: pFedMe's Alg. 1 line 8 (and its code) use c = λ, the
gradient of (λ/2)‖θ − ω̃‖²; CGPFL's Alg. 1 line 10 uses ∇_ω G = (2/N)∇r, c = 2/N.
One iteration is written for one client's minibatch; a method runs it as its update rule
(``update_rule``), so the engine draws the minibatches and batches the cohort.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ...engine.contract import Tree
from .proximal import prox_solve


def moreau_iteration(
    risk: Callable[[Tree], Tensor],
    theta: Tree,
    omega: Tree,
    *,
    lambda_: float,
    inner_steps: int,
    inner_lr: float,
    omega_lr: float,
    omega_weight: float,
) -> tuple[Tree, Tree, Tensor]:
    """One local iteration on the minibatch that ``risk`` (θ → R(θ)) evaluates: the new θ
    and ω̃, and the mean of F over the S steps (each taken before its step)."""
    # Alg. 1 lines 6–8: S steps on the same minibatch (common.proximal.prox_solve)
    theta, value = prox_solve(risk, theta, omega, lambda_, inner_lr, inner_steps, with_value=True)
    # ω̃ ← ω̃ − β·c·(ω̃ − θ) (pFedMe line 8: c = λ; CGPFL line 10: c = 2/N)
    omega = {k: omega[k] - omega_lr * omega_weight * (omega[k] - theta[k]) for k in omega}
    return theta, omega, value
