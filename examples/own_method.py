"""Writing your own method: not-true distillation (after FedNTD — Lee, Jeong, Shin, Bae,
Yun, "Preservation of the Global Knowledge by Not-True Distillation in Federated Learning",
NeurIPS 2022), defined here, checked, and compared with FedAvg under label skew.

    python examples/own_method.py [--rounds 30] [--out example-output/own-method]

Client objective: CE(q, y) + β·τ²·KL(q̃_τ^g ‖ q̃_τ^l), where q̃_τ are the softmax outputs
at temperature τ over the classes *other than the label*, of the received global model (g)
and of the local model (l): the client learns its labels while keeping the global model's
knowledge of the classes it barely sees. β = 0 is FedAvg. The data is `dirichlet` label
shift on scikit-learn's digits (offline). FEDSHIFT_EXAMPLE_SMALL=1 runs 2 rounds. The
command line can use the method too, since importing this file does not run `main`:
`fedshift run --import examples/own_method.py --set algorithm=fedntd` (docs/extending.md).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import torch

import fedshift as fs
from fedshift.algorithms.common.losses import cross_entropy, weighted_mean
from fedshift.algorithms.fedavg import FedAvg

SMALL = os.environ.get("FEDSHIFT_EXAMPLE_SMALL") == "1"


@dataclass(frozen=True)
class FedNTDHyper:
    beta: float = fs.opt(1.0, "weight β of the not-true distillation (β = 0: FedAvg)")
    tau: float = fs.opt(1.0, "softmax temperature τ of the distillation")

    def __post_init__(self):
        fs.require(self.beta >= 0, f"algorithm.beta must be >= 0, got {self.beta}")
        fs.require(self.tau > 0, f"algorithm.tau must be positive, got {self.tau}")


def not_true_log_probs(logits, y, tau):
    """log-softmax at temperature τ over the classes other than the label (whose logit is
    pushed to a huge negative value: its probability is 0 for teacher and student alike)."""
    is_label = y[:, None] == torch.arange(logits.shape[-1], device=logits.device)
    return torch.log_softmax(logits.masked_fill(is_label, -1e9) / tau, dim=-1)


@fs.register_algorithm("fedntd")
class FedNTD(FedAvg):
    """FedAvg whose clients distil the global model's not-true class probabilities."""

    Hyper = FedNTDHyper

    def loss(self, params, buffers, anchor, x, y, w):
        logits = self.ctx.forward(params, buffers, x)
        teacher = self.ctx.forward({k: anchor[k] for k in params}, buffers, x).detach()
        log_g, log_l = (not_true_log_probs(z, y, self.hp.tau) for z in (teacher, logits))
        kl = (log_g.exp() * (log_g - log_l)).sum(-1)  # KL(q̃_g ‖ q̃_l) per sample
        return cross_entropy(logits, y, w) + self.hp.beta * self.hp.tau**2 * weighted_mean(kl, w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2 if SMALL else 30)
    parser.add_argument("--out", type=Path, default=Path("example-output/own-method"))
    args = parser.parse_args()
    db = args.out / "runs.db"
    data = fs.scenario("dirichlet", dataset="digits", clients=10, alpha=0.1, samples=0)
    settings = dict(data=data, rounds=args.rounds, local_epochs=2, lr=0.05)

    # the reduction the docstring promises, checked before any comparison
    plain = fs.run(algorithm="fedavg", rounds=2, data=data)
    zero = fs.run(algorithm="fedntd", rounds=2, data=data, algorithm_options={"beta": 0.0})
    assert zero.metrics["per_client"] == plain.metrics["per_client"], "β = 0 must be FedAvg"
    print("check: FedNTD with β = 0 gives FedAvg's accuracies")

    for algorithm in ("fedavg", "fedntd"):
        out = fs.run(algorithm=algorithm, db=db, **settings)
        m = out.metrics
        print(f"{algorithm:7s} average {m['average']:5.1f}  worst client "
              f"{m['worst_client']:5.1f}  (run {out.run_id})")  # fmt: skip
    print(f"runs in {db}; fedshift compare RUN_ID RUN_ID --db {db} plots them side by side")


if __name__ == "__main__":
    main()
