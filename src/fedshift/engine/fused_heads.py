"""A fused cohort step for linear heads on fixed inputs, one head per group of rows.

FedSDR fits an environment classifier ω_e (linear, on Ψ's fixed features) to the rows of
each training environment e for K epochs per local iteration (Alg. 2 line 12): in
Table 5.1 that is 11,200 steps a round of a [E·K × d] product on 64 rows per client, where
the general step's fixed costs (gathering the step's tensors into dictionaries, building
the environment masks and one-hot targets, a separate gradient tensor and SGD update) were
most of the time. A loss marked :func:`grouped_linear_cross_entropy` declares that it *is*

    Σ_e Σ_{b: g_b = e} w_b · CE(W_e z_b + c_e, y_b) / max(Σ_{b: g_b = e} w_b, 1)

(the rows' group ids ``g`` the split's environment ids, ``W`` [E, K, d] and ``c`` [E, K] two
trained parameters), and the trainer then runs this step over the whole schedule: the
labels' and groups' part of ∂/∂logits built once per block of steps, one ``baddbmm`` for
every head's logits, and the update applied in place as part of the weight-gradient product,
as in the MLP's fused step (``fused.py``). The same mathematics as the general path, equal
to it up to float32 rounding (``tests/engine/test_fused_heads.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .fused import BLOCK_ELEMENTS
from .sgd import SGDConfig, sgd_update_
from .tree import Tree

MARK = "__fedshift_grouped_linear_cross_entropy__"


def grouped_linear_cross_entropy(weight: str, bias: str) -> Callable:
    """Declare that the loss ``fn(params, buffers, extras, z, y, w)`` is exactly the
    per-group weighted cross-entropy above of the heads ``params[weight]`` [E, K, d] and
    ``params[bias]`` [E, K] on the inputs z, grouped by ``extras["env"]``. An override
    loses the mark."""

    def mark(fn: Callable) -> Callable:
        setattr(fn, MARK, (weight, bias))
        return fn

    return mark


class FusedGroupedHeads:
    """In-place SGD steps of a cohort of grouped linear heads (see the module docstring)."""

    def __init__(self, names: tuple[str, str], sgd: SGDConfig):
        self.weight, self.bias = names
        self.sgd = sgd
        self.plain = not sgd.momentum and not sgd.weight_decay

    @staticmethod
    def applies(
        loss_fn: Callable, params: Tree, train_keys: tuple[str, ...], env, noise, extras: bool
    ) -> tuple[str, str] | None:
        """The heads' parameter names when the fused step runs this call: a marked loss, the
        rows' group ids known, both heads trained and nothing else given."""
        names = getattr(loss_fn, MARK, None)
        if names is None or env is None or noise or extras:
            return None
        if set(params) != set(names) or set(train_keys) != set(names):
            return None
        return names

    def train(
        self,
        params: Tree,
        momentum: Tree,
        z: Tensor,
        y: Tensor,
        env: Tensor,
        idx: Tensor,
        wgt: Tensor,
        active: list[int],
        between_steps: Callable[[], None] = lambda: None,
    ) -> Tensor:
        """Every step of a schedule (``idx``/``wgt`` [C, S, B] rows of ``z`` [N, d], labels
        ``y`` and group ids ``env`` [N]; the ``active[s]`` clients still training at step
        ``s`` a prefix of the cohort); returns the [C] sums of each client's step losses,
        each taken before its step."""
        weight, bias = params[self.weight], params[self.bias]  # [C, E, K, d], [C, E, K]
        c, e, k, d = weight.shape
        b = idx.shape[2]
        lr = self.sgd.lr
        acc = torch.zeros(c, e, k, b, dtype=z.dtype, device=z.device)
        per_step = c * e * (k + 1) * b
        block = max(1, BLOCK_ELEMENTS // max(per_step, 1))
        groups = torch.arange(e, device=z.device)[:, None]
        classes = torch.arange(k, device=z.device)[:, None]
        views: dict[int, tuple] = {}
        for s0 in range(0, len(active), block):
            s1 = min(s0 + block, len(active))
            rows = idx[:, s0:s1].transpose(0, 1).reshape(s1 - s0, c * b)
            w = wgt[:, s0:s1].transpose(0, 1).reshape(s1 - s0, c, 1, b)
            # each head's share of each row: w_b / max(Σ w over the row's group, 1)
            mask = (env[rows].view(s1 - s0, c, 1, b) == groups).to(z.dtype) * w  # [S, C, E, B]
            scale = mask / mask.sum(-1, keepdim=True).clamp(min=1.0)
            target = (y[rows].view(s1 - s0, c, 1, 1, b) == classes).to(z.dtype)  # [S, C, 1, K, B]
            neg = (-target * scale.unsqueeze(3)).contiguous()  # −onehot·scale [S, C, E, K, B]
            scale = scale.unsqueeze(3).contiguous()
            for s in range(s0, s1):
                between_steps()  # may raise to abandon the training (a stop request)
                n = active[s]
                if n not in views:
                    views[n] = (
                        weight[:n].view(n, e * k, d),
                        bias[:n].view(n, e * k, 1),
                        {name: t[:n] for name, t in momentum.items()},
                        acc[:n],
                    )
                w_n, b_n, mom, acc_n = views[n]
                zb = z.index_select(0, rows[s - s0, : n * b]).view(n, b, d)
                logits = torch.baddbmm(b_n, w_n, zb.transpose(1, 2)).view(n, e, k, b)
                logp = torch.log_softmax(logits, 2)
                acc_n.addcmul_(neg[s - s0, :n], logp)
                # ∂loss/∂logits = (softmax − onehot)·scale, [n, E·K, B]
                delta = torch.addcmul(neg[s - s0, :n], logp.exp_(), scale[s - s0, :n])
                delta = delta.view(n, e * k, b)
                if self.plain:
                    w_n.baddbmm_(delta, zb, alpha=-lr)
                    b_n.sub_(delta.sum(2, keepdim=True), alpha=lr)
                else:
                    grads = {
                        self.weight: torch.bmm(delta, zb).view(n, e, k, d),
                        self.bias: delta.sum(2).view(n, e, k),
                    }
                    trained = {self.weight: weight[:n], self.bias: bias[:n]}
                    sgd_update_(trained, grads, mom, self.sgd)
        return acc.sum((1, 2, 3))
