"""FedSDR's research options, not in the thesis (docs/methods/invariant.md, measured on
``scm``; all off by default): the shortcut *views* stage 2 may decorrelate Φ_u from besides
the thesis's Ψ(x), and the estimators of I(Φ_u; view | Y) besides §4.4.2's cross-moment.

* ``disagreement``: the environment classifiers' centred outputs ω_e(Ψ(x)) − mean_e' ω_e'(Ψ(x)).
* ``signature``: Ψ(x) projected on the directions whose class-conditional means differ
  between environments more than between the clients of one environment (Lemma 4.4.1's
  Z_S ⊥ U | Y, E). Each participant uploads per-(environment, class) sums of Ψ^t(x); the
  server keeps every client's last report and solves an eigenproblem
  (common/shortcut_signature.py); round t uses the reports up to round t − 1.
* ``correlation``: mean |within-class correlation| of Φ_u and the view (scale-free);
  ``prediction``: the same between f_u's centred logits and the view.
"""

from __future__ import annotations

import torch

from ..engine.contract import Payload, RoundInfo, Tree
from .common.alignment import class_feature_sums
from .common.local_stats import client_sums
from .common.representation import conditional_correlation_l1
from .common.shortcut_signature import group_means, shortcut_directions, within_covariance

VIEWS = ("features", "disagreement", "signature")
ESTIMATORS = ("moment", "correlation", "prediction")
SERVER_ONLY = ("sum", "count", "within")  # the signature view's server tables (in "sig")


def correlation_penalty(estimator: str, phi, logits, psi, y, w, k: int):
    """Î(Φ_u; view | Y) by the ``correlation`` or ``prediction`` estimator."""
    signal = phi if estimator == "correlation" else logits - logits.mean(1, keepdim=True)
    return conditional_correlation_l1(signal, psi, y, w, k)


class SignatureView:
    """The ``signature`` view's statistics: uploaded by the participants, kept and turned
    into shortcut directions by the server. A no-op for every other view. Server state:
    ``{"sig": {"sum", "count", "within", "proj"}}``; uploads ``{"sig": {"count", "sum",
    "outer"}}``."""

    def signature_tables(self, e: int, k: int, d: int) -> Tree:
        if self.hp.shortcut_view != "signature":
            return {}
        sig = {
            "sum": torch.zeros(self.ctx.data.num_clients, e, k, d),
            "count": torch.zeros(self.ctx.data.num_clients, e, k),
            "within": torch.zeros(d, d),
            "proj": torch.zeros(d, d),
        }
        return {"sig": sig}

    def signature_stats(self, model: Tree, shared: Tree, x, y, mask) -> Tree:
        """For ONE client's chunk, grouped by environment × class (``y`` = env·K + class):
        counts, feature sums, and Σ Ψ(x)Ψ(x)ᵀ."""
        groups = len(self.ctx.data.train_env_names) * self.ctx.data.num_classes
        sums = class_feature_sums(self.ctx, {**shared, **model}, x, y, mask, groups, outer=True)
        return {k: sums[k] for k in ("count", "sum", "outer")}

    def signature_upload(self, payload: Payload, cohort) -> Tree:
        """Each client's statistics of the received Ψ^t, for the signature view."""
        if self.hp.shortcut_view != "signature":
            return {}
        if getattr(self, "_group_labels", None) is None:  # environment·K + class, per row
            data = self.ctx.data
            self._group_labels = data.train.env * data.num_classes + data.train.y
        model = payload.broadcast["sd"]
        sums = client_sums(
            self.ctx, self.signature_stats, cohort, {}, model, labels=self._group_labels
        )
        return {"sig": sums}

    def signature_aggregate(self, out: Tree, uploads: Tree, info: RoundInfo) -> None:
        """Store the participants' group means, then recompute the shortcut directions from
        every client reported so far (their last report)."""
        if self.hp.shortcut_view != "signature":
            return
        e, k = len(self.ctx.data.train_env_names), self.ctx.data.num_classes
        up = uploads["sig"]
        counts, sums = up["count"], up["sum"]  # [C, E·K], [C, E·K, d]
        sig = out["sig"] = dict(out["sig"])  # ``out`` is a shallow copy of the server state
        ids = info.ids.to(sig["sum"].device)
        sig["sum"] = sig["sum"].index_copy(0, ids, sums.view(len(ids), e, k, -1))
        sig["count"] = sig["count"].index_copy(0, ids, counts.view(len(ids), e, k))
        if counts.sum() > 0:
            sig["within"] = within_covariance(up["outer"], sums, counts)
        sig["proj"] = shortcut_directions(
            group_means(sig["sum"], sig["count"]),
            sig["count"],
            sig["within"],
            self.hp.signature_ridge,
            self.hp.signature_threshold,
        )
