"""Diagnostic, not a method: FedSDR's stage 2 given the TRUE shortcut.

``fedsdr-oracle-colour`` is FedSDR (fedshift.algorithms.fedsdr) with one change: the
shortcut view that stage 2 decorrelates Φ_u from is the image's colour itself, read from
the input (the share of ink in each of cmnist's two channels, [B, 2]), instead of the
discovered Ψ(x). Stage 1 is skipped (its output would be unused). If f_u trained on
ℓ_SR = R(f_u) + γ·Î(Φ_u; colour | Y) — the thesis's estimator, §4.4.2 — leaves the colour,
stage 2 works and what FedSDR lacks on CMNIST is stage 1's Ψ; if it does not, the removal
step itself (its estimator or γ) is what fails. Use with ``--import`` on this file:

    fedshift run --import docs/results/fedsdr-oracle-view/fedsdr_oracle.py \
        --set algorithm=fedsdr-oracle-colour --set scenario=cmnist ...
"""

from __future__ import annotations

from fedshift.algorithms.base import register_algorithm
from fedshift.algorithms.fedsdr import ENV, FedSDR
from fedshift.engine.contract import stack


@register_algorithm("fedsdr-oracle-colour")
class FedSDROracleColour(FedSDR):
    """FedSDR whose shortcut view is cmnist's colour (diagnostic)."""

    def shortcut(self, extras, x):
        if x.dim() != 4 or x.shape[1] != 2:
            raise ValueError("fedsdr-oracle-colour reads cmnist's two colour channels [B, 2, H, W]")
        ink = x.flatten(2).sum(-1)  # [B, 2]
        return ink / ink.sum(-1, keepdim=True).clamp(min=1e-8)

    def discovery_train(self, payload, cohort):
        """Stage 1 skipped: the received Ψ and environment classifiers, uploaded unchanged."""
        b = payload.broadcast
        return stack({"sd": b["sd"], **{k: b[k] for k in ENV}}, len(cohort))
