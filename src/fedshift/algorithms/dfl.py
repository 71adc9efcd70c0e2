"""DFL — Luo, Wang, Zhang, Wang, Cheng, "Disentangled Federated Learning for Tackling
Attributes Skew via Invariant Aggregation and Diversity Transferring", ICML 2022;
Algorithms 1–2.

Client model: invariant extractor E_c (aggregated), specific extractor E_s (local only) and
predictor P on [E_c(x), E_s(x)] (models/two_branch.py; DFL replaces the run's model by the
two-branch version of it, E_s a freshly initialised copy of its extractor). Client loss (eq. 8)

    h_k = F_k + I_s(E_s(x); E_c(x)) − I_c(E_c^k(x); E_c^G(x)),
    F_k = CE(P[E_c ⊕ E_s]) + λ/(K−1) Σ_{j≠k} CE(P[E_c ⊕ E_s^j])   (diversity transferring),

MI terms by the Jensen–Shannon estimator with small critics (common/mi.py). Per round: step 1
trains E_s (with P and the critics) with E_c frozen at the received global E_c^G; step 2
trains E_c (with P and the critics) with E_s frozen; the server averages E_c with weights
n_k (eq. 6). The critics maximise their MI estimates; I_s is minimised by E_s alone, against
its critic (a stop-gradient split of the term), and E_c is updated by F_k − I_c alone: zc is
detached in I_s (Algorithm 2; appendix: ∇_{ω_c} h_k = P_c ∇F_k − ∇I_c).

Defaults: λ = 1, E = 20 local epochs, B = 32, lr = 0.01, T = 200 (the run's settings);
backbone ``dfl-cnn``. Choices where the paper is silent:
* donors: the other clients' E_s travel through the server: each client uploads its E_s
  after training (kept in a server bank) and receives ``donors`` banked E_s of other
  clients, drawn at random per (seed, round, client); both directions are counted as
  traffic. Donor extractors run in eval mode (their BatchNorm running statistics) and
  are not trained. In the first round no E_s is banked yet, so F_k is plain CE.
* P and the critics are local (never aggregated); a client is evaluated with the latest
  global E_c^G and its own E_s and P. ``mi_weight`` scales I_s and I_c (1 in the paper);
  critics have one hidden layer of ``critic_hidden`` units; E_c^G runs in eval mode.
* BatchNorm running statistics of E_c (``invariant_bn``): they are buffers, not the trained
  weights that eq. (6) averages, and on attribute skew they are domain-specific (a
  background colour shifts every first-layer channel mean). With ``local`` (default) each
  client keeps its own E_c statistics (updated while it trains, as in FedBN) and is
  evaluated with E_c^G's weights and them; a client that has not trained yet uses the
  average. With ``global`` the statistics are averaged with the weights and evaluation
  uses the average, which mis-normalises each client's domain: on bgcolor-mnist
  (docs/results/dfl-bgcolor-mnist-reduced) that, not the MI terms, caused DFL's late
  decline. The server still averages the statistics (E_c^G in I_c runs with them).

State (model parameter names inside): server ``{"p": E_c params, "b": E_c buffers,
"bank": {"p": …, "b": …} (every client's latest E_s, stacked), "banked": [N]}`` (the bank
only with diversity transferring); client ``{"p": E_s, P and critic params, "b": E_s (and
local E_c) buffers}``. A round's per-client payload: ``{"donor": {"p": …, "b": …} (E_s of the
donors, [C, D, …]), "donor_mask": [C, D]}``; the loss sees E_c^G as ``extras["global"]``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call

from ..engine.contract import (
    Tree,
    flatten,
    generator,
    put,
    stack,
    take,
    tree_map,
    weighted_mean,
)
from ..models.two_branch import TwoBranch
from ..options import opt, require
from .base import Algorithm, ClientResult, Payload, Prediction, RoundInfo, register_algorithm
from .common.global_model import model_state, split_state
from .common.losses import cross_entropy
from .common.mi import init_critic, jsd_mi
from .common.split import submodule

E_C, E_S = "extractor.invariant", "extractor.specific"  # submodules of the TwoBranch model
INV, SPEC, HEAD = f"{E_C}.", f"{E_S}.", "head."  # the prefixes of their parameter names


def parts(state: Tree) -> tuple[Tree, Tree]:
    """(parameters, buffers) of a ``{"p": …, "b": …}`` tree, either possibly absent: E_c of
    a model whose extractor has no parameters (``mlr``) is empty, and empty sub-trees do
    not survive a checkpoint or a Flower message."""
    return dict(state.get("p", {})), dict(state.get("b", {}))


def model_part(p: Tree, b: Tree, prefix: str) -> Tree:
    """``{"p": …, "b": …}`` of the parameters and buffers of module ``prefix`` (full names)."""
    return model_state(
        {k: v for k, v in p.items() if k.startswith(prefix)},
        {k: v for k, v in b.items() if k.startswith(prefix)},
    )


@dataclass(frozen=True)
class DFLHyper:
    lambda_: float = opt(1.0, "weight λ of diversity transferring (0 = no E_s transfer)")
    donors: int = opt(9, "other clients' E_s sent to each client (K − 1 of 10 sampled)")
    mi_weight: float = opt(1.0, "weight of the MI terms I_s − I_c")
    critic_hidden: int = opt(64, "hidden units of each MI critic")
    invariant_bn: str = opt(
        "local",
        "BatchNorm running statistics of E_c at evaluation: the client's own or the average",
        ("local", "global"),
    )

    def __post_init__(self) -> None:
        require(self.lambda_ >= 0, f"algorithm.lambda_ must be >= 0, got {self.lambda_}")
        require(self.donors >= 0, f"algorithm.donors must be >= 0, got {self.donors}")
        require(self.mi_weight >= 0, f"algorithm.mi_weight must be >= 0, got {self.mi_weight}")
        require(self.critic_hidden >= 1, "algorithm.critic_hidden must be >= 1")


@register_algorithm("dfl")
class DFL(Algorithm):
    Hyper = DFLHyper
    personalized = True

    @classmethod
    def wrap_model(cls, model, hyper, data, seed):
        """E_c is the run's model's extractor; E_s a freshly initialised copy of it (seeded
        by ``seed + 1``), the head reads both."""
        return TwoBranch(model, data.num_classes, seed=seed + 1)

    def __init__(self, hyper, ctx) -> None:
        super().__init__(hyper, ctx)
        net = self.net = ctx.model  # the TwoBranch of wrap_model
        self.frozen_invariant = copy.deepcopy(net.extractor.invariant).eval()  # E_c^G
        self.frozen_specific = copy.deepcopy(net.extractor.specific).eval()  # donors E_s^j
        self.transfer = hyper.lambda_ > 0 and hyper.donors > 0

    def init(self) -> Tree:
        p, b = self.ctx.initial_params, self.ctx.initial_buffers
        server = model_part(p, b, INV)
        if self.transfer:  # bank of the clients' latest E_s (diversity transferring)
            n = self.ctx.data.num_clients
            server["bank"] = stack(model_part(p, b, SPEC), n)
            server["banked"] = torch.zeros(n, dtype=torch.bool)
        return server

    def init_client_state(self, server: Tree) -> Tree:
        p, b = self.ctx.initial_params, self.ctx.initial_buffers
        d = self.net.feature_dim // 2
        g = torch.Generator().manual_seed(self.ctx.seed)
        critics = {}  # parameters of the critic modules "critic_s" and "critic_c"
        for name in ("critic_s", "critic_c"):
            critic = init_critic(2 * d, self.hp.critic_hidden, g)
            critics.update({f"{name}.{k}": v for k, v in critic.items()})
        dev = self.ctx.device
        local = {k: v for k, v in p.items() if not k.startswith(INV)}
        local.update({k: v.to(dev) for k, v in critics.items()})
        return model_state(local, {k: v for k, v in b.items() if self.local_buffer(k)})

    def local_buffer(self, name: str) -> bool:
        """Buffers kept in the client state: E_s's, and E_c's with ``invariant_bn=local``."""
        return name.startswith(SPEC) or (self.hp.invariant_bn == "local" and name.startswith(INV))

    # ---- Algorithm 1: the server sends E_c^G (and donor E_s) -----------------------------
    def configure(self, server: Tree, cohort) -> Payload:
        broadcast = {k: v for k, v in server.items() if k in ("p", "b")}
        if not self.transfer or not bool(server["banked"].any()):
            return Payload(broadcast=broadcast)
        banked = server["banked"].cpu().numpy()
        picks = []
        for cid in cohort.ids.tolist():
            cand = np.flatnonzero(banked & (np.arange(len(banked)) != cid))
            rng = generator(self.ctx.seed, cohort.round, cid, "dfl-donors")
            picks.append(rng.choice(cand, size=min(self.hp.donors, len(cand)), replace=False))
        d = max(len(p) for p in picks)  # no empty slots when every client has enough donors
        if d == 0:
            return Payload(broadcast=broadcast)
        idx = np.zeros((len(cohort), d), np.int64)
        mask = np.zeros((len(cohort), d), np.float32)
        for i, pick in enumerate(picks):
            idx[i, : len(pick)], mask[i, : len(pick)] = pick, 1.0
        rows = torch.from_numpy(idx).to(server["banked"].device)
        donors = {
            "donor": take(server.get("bank", {}), rows),
            "donor_mask": torch.from_numpy(mask).to(self.ctx.device),
        }
        return Payload(broadcast=broadcast, per_client=donors)

    # ---- eq. (8): the client loss -------------------------------------------------------
    def loss(self, params: Tree, buffers: Tree, extras: Tree, x, y, w):
        net = self.ctx.model  # self.net, or this client-group thread's copy
        zc = functional_call(
            net.extractor.invariant, (submodule(params, E_C), submodule(buffers, E_C)), (x,)
        )
        zs = functional_call(
            net.extractor.specific, (submodule(params, E_S), submodule(buffers, E_S)), (x,)
        )
        head = submodule(params, "head")
        risk = cross_entropy(functional_call(net.head, head, (torch.cat([zc, zs], -1),)), y, w)
        if "donor_mask" in extras:  # diversity transferring, eq. (7)–(8)
            mask = extras["donor_mask"]
            donor_p, donor_b = parts(extras.get("donor", {}))
            dp, db = submodule(donor_p, E_S), submodule(donor_b, E_S)
            terms = []
            for j in range(mask.shape[0]):
                zj = functional_call(
                    self.ctx.module(self.frozen_specific),
                    ({k: v[j] for k, v in dp.items()}, {k: v[j] for k, v in db.items()}),
                    (x,),
                )
                logits = functional_call(net.head, head, (torch.cat([zc, zj], -1),))
                terms.append(cross_entropy(logits, y, w))
            transfer = (torch.stack(terms) * mask).sum() / mask.sum().clamp(min=1.0)
            risk = risk + self.hp.lambda_ * transfer
        critic_s, critic_c = submodule(params, "critic_s"), submodule(params, "critic_c")
        # I_s(E_s^k; E_c): E_s minimises it against a frozen critic, the critic maximises it.
        # E_c gets no gradient from it (Algorithm 2: step 1 descends ∇_{ω_s} I_s, step 2
        # updates E_c by F_k − I_c alone), so zc is detached in both terms.
        zc_d = zc.detach()
        i_s = jsd_mi({k: v.detach() for k, v in critic_s.items()}, zs, zc_d, w) - jsd_mi(
            critic_s, zs.detach(), zc_d, w
        )
        glob_p, glob_b = parts(extras.get("global", {}))  # E_c^G
        zg = functional_call(
            self.ctx.module(self.frozen_invariant),
            (submodule(glob_p, E_C), submodule(glob_b, E_C)),
            (x,),
        )
        i_c = jsd_mi(critic_c, zc, zg.detach(), w)  # maximised by E_c^k and its critic
        return risk + self.hp.mi_weight * (i_s - i_c)

    def client_update(self, payload: Payload, state: Tree, cohort) -> ClientResult:
        n = len(cohort)
        glob_p, glob_b = parts(payload.broadcast)
        local_p, local_b = split_state(state)
        params = {**stack(glob_p, n), **local_p}
        buffers = {**stack(glob_b, n), **local_b}
        shared = {"global": payload.broadcast}
        kw = dict(shared=shared, per_client=payload.per_client)
        # step 1: E_s (with P and the critics), E_c frozen at E_c^G
        s1 = self.ctx.train(
            self.loss,
            params,
            buffers,
            cohort,
            "train/specific",
            trainable=lambda k: not k.startswith(INV),
            **kw,
        )
        # step 2: E_c (with P and the critics), E_s frozen
        s2 = self.ctx.train(
            self.loss,
            s1.params,
            s1.buffers,
            cohort,
            "train/invariant",
            trainable=lambda k: not k.startswith(SPEC),
            **kw,
        )
        inv = model_part(s2.params, s2.buffers, INV)
        local = model_state(
            {k: v for k, v in s2.params.items() if not k.startswith(INV)},
            {k: v for k, v in s2.buffers.items() if self.local_buffer(k)},
        )
        upload = dict(inv)
        if self.transfer:  # E_s goes to the server's bank for diversity transferring
            upload["bank"] = model_part(local["p"], local["b"], SPEC)
        return ClientResult(upload, local, cohort.num_examples, (s1.loss + s2.loss) / 2)

    def aggregate(self, server: Tree, uploads: Tree, info: RoundInfo) -> Tree:
        inv = {k: v for k, v in uploads.items() if k != "bank"}
        new = {**server, **weighted_mean(inv, info.num_examples)}  # eq. (6)
        if self.transfer:
            ids = info.ids.to(server["banked"].device)
            new["bank"] = tree_map(torch.clone, server.get("bank", {}))
            # written through the flat views (the same tensors): an empty part (no buffers)
            # may be missing on one side after a checkpoint or a Flower message
            put(flatten(new["bank"]), ids, flatten(uploads.get("bank", {})))
            new["banked"] = server["banked"].clone()
            new["banked"][ids] = True
        return new

    def predictor(self, server: Tree, state: Tree, cohort) -> Prediction:
        n = len(cohort)
        glob_p, glob_b = parts(server)
        local_p, local_b = split_state(state)
        params = {
            **stack(glob_p, n),
            **{k: v for k, v in local_p.items() if not k.startswith("critic")},
        }
        buffers = {**stack(glob_b, n), **local_b}
        for k, v in local_b.items():  # own E_c statistics once the client has trained
            count = local_b.get(k.rsplit(".", 1)[0] + ".num_batches_tracked")
            if k.startswith(INV) and k in glob_b and count is not None and v.is_floating_point():
                mine = (count > 0).view(-1, *[1] * (v.dim() - 1))
                buffers[k] = torch.where(mine, v, glob_b[k].to(v.device).expand_as(v))
        return Prediction(params, buffers, shared=False)
