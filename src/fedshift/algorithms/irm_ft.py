"""IRM†-FT — the thesis' fine-tuned IRM† (ch. 4, §4.5.5 and Table 4.3): the global model is
trained by IRM† (irm.py); at evaluation every client fine-tunes it on its own training data
by local ERM, as FTFA does for FedAvg (Cheng, Chadha, Duchi 2021; common/finetune.py).

Personal model: θ_i = SGD^E(R_i; from w_IRM), E = ``finetune_epochs``; the copies are not
kept. Defaults: 1 epoch at the run's learning rate, as FTFA (the thesis gives no value).
``finetune_epochs = 0`` → IRM†'s predictions (tested). The global model is trained exactly
as ``irm`` (server optimiser, penalty annealing and the rescaling rule: the objective is
divided by λ only under a scale-free server step, irm.py); with the FedAdam anchor recipe
(one local step of lr 1) give ``finetune_lr`` explicitly, as the run's lr is then 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contract import Tree
from ..options import opt, require
from .base import Prediction, register_algorithm
from .common.finetune import finetuned_prediction
from .common.losses import cross_entropy
from .irm import IRM, IRMHyper


@dataclass(frozen=True)
class IRMFTHyper(IRMHyper):
    finetune_epochs: int = opt(1, "local epochs of fine-tuning before evaluation (0 = IRM†)")
    finetune_lr: float = opt(0.0, "fine-tuning learning rate (0 = the run's lr)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.finetune_epochs >= 0, "algorithm.finetune_epochs must be >= 0")
        require(self.finetune_lr >= 0, "algorithm.finetune_lr must be >= 0")


@register_algorithm("irm-ft")
class IRMFT(IRM):
    Hyper = IRMFTHyper
    personalized = True

    def erm_loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        """Fine-tuning objective: the client's plain empirical risk R_i."""
        return cross_entropy(self.ctx.forward(params, buffers, x), y, w)

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        hp = self.hp
        return finetuned_prediction(
            self, server, cohort, self.erm_loss, hp.finetune_epochs, hp.finetune_lr
        )
