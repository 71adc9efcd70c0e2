"""FTFA — FedAvg followed by local fine-tuning (Cheng, Chadha, Duchi, "Fine-tuning is Fine
in Federated Learning", 2021; the FTFA baseline of the thesis, Table 5.1).

Training is FedAvg's. At evaluation each client starts from the global model and runs
``finetune_epochs`` epochs of local SGD on its own training data (seeded by run seed,
round and client, purpose "finetune"), and is evaluated with the result; the fine-tuned
copies are not kept. ``finetune_epochs = 0`` evaluates the global model (= FedAvg).
Default: 1 epoch, a common choice in the pFL literature (the paper sweeps it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contract import Tree
from ..options import opt, require
from .base import Prediction, register_algorithm
from .common.finetune import finetuned_prediction
from .fedavg import FedAvg


@dataclass(frozen=True)
class FTFAHyper:
    finetune_epochs: int = opt(1, "local epochs of fine-tuning before evaluation (0 = FedAvg)")
    finetune_lr: float = opt(0.0, "fine-tuning learning rate (0 = the run's lr)")

    def __post_init__(self) -> None:
        require(self.finetune_epochs >= 0, "algorithm.finetune_epochs must be >= 0")
        require(self.finetune_lr >= 0, "algorithm.finetune_lr must be >= 0")


@register_algorithm("ftfa")
class FTFA(FedAvg):
    Hyper = FTFAHyper
    personalized = True

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        hp = self.hp
        return finetuned_prediction(
            self, server, cohort, self.loss, hp.finetune_epochs, hp.finetune_lr
        )
