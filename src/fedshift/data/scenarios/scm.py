"""``scm``: the synthetic linear structural causal model of the thesis (§4.5.1, after
Rosenfeld et al., "The Risks of Invariant Risk Minimization", ICLR 2021).

Per sample of client u in environment e:

    y ∈ {−1, +1} equiprobable,
    Z_C^g ~ N(y·μ_cg, σ_cg² I)   (d = 3; μ_cg shared by everyone),
    Z_C^u ~ N(y·μ_cu, σ_cu² I)   (d = 3; μ_cu one per client),
    Z_S   ~ N(y·μ_s,  σ_s²  I)   (d = 6; μ_s one per environment: the shortcut),
    X = W [Z_C^g, Z_C^u, Z_S]    (W a fixed random 12×12 matrix, entries N(0, 1/12)),

with μ_cg, μ_cu ~ N(0, 1.5 I) and μ_s ~ N(m_s, 0.75 I) (the second argument read as a
covariance), σ_cg = σ_cu = 2, σ_s = 1. Class index = (y + 1) / 2. The thesis writes the μ_s
prior with zero mean (m_s = 0, our default); ``mu_s_centre_var`` > 0 draws a shared centre
m_s ~ N(0, mu_s_centre_var·I) with the dataset, as the thesis's reference does with its
random prior parameters — under a zero-mean prior no method's average over test
environments can exceed the causal oracle, yet the thesis reports averages above it
(docs/scenarios.md).

Federation (choices where the thesis is brief): each training environment's samples are
spread over the clients that hold it, every client holding one training environment
(balanced: 10 training environments over 100 clients → 10 clients each, 1,000 samples per
client); each test environment's samples are spread evenly over all clients, generated
with the client's own μ_cu; validation environments (fresh μ_s draws) likewise.

**Oracle** (the thesis's "≈97.5 %" reference): with equiprobable labels and isotropic
noise, the Bayes classifier of client u on the causal latents is
sign(μ_cg·Z_C^g/σ_cg² + μ_cu·Z_C^u/σ_cu²); it ignores Z_S, so its accuracy is the same in
every environment: Φ(√(‖μ_cg‖²/σ_cg² + ‖μ_cu‖²/σ_cu²)). :func:`oracle_accuracy` computes it
per client (``info["oracle_accuracy"]`` holds the client mean, in %, for reports to draw as
a dashed line); :func:`empirical_oracle` applies that classifier to the stored data.
The thesis's 97.5 % is the value of its own random draw of the means: under the stated
priors the client-averaged oracle depends on the draw (seeds 0–199: mean 90.7 %, 5th–95th
percentile 84–97.6 %). We therefore treat W, μ_cg and μ_cu as the *dataset* — one fixed
draw, ``means_seed`` (default 21: the first draw whose oracle is within 0.3 points of
97.5 %, namely 97.49 %) — while the run seed draws the environment means μ_s, the samples
and the client–environment assignment. ``means_seed = -1`` draws everything from the run
seed instead (see docs/scenarios.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...options import opt, require
from .. import partition as P
from ..federated import FederatedData, Split
from ..registry import register_scenario
from ._images import balanced_assignment

# The first seed whose client-averaged oracle (100 clients, the thesis's priors) lies within
# 0.3 points of the thesis's 97.5 %: 97.49 %, every client between 95.6 and 99.9 %.
THESIS_MEANS_SEED = 21


@dataclass
class SCMOptions:
    clients: int = opt(100, "number of clients (thesis: 100)")
    participation: float = opt(0.1, "fraction of clients sampled per round (thesis: 0.1)")
    train_envs: int = opt(10, "training environments, one per client (thesis: 10)")
    test_envs: int = opt(5000, "test environments (thesis: 5000; ~2.4 GB at 10,000 samples)")
    val_envs: int = opt(10, "validation environments (fresh μ_s draws, for model selection)")
    samples_per_env: int = opt(10_000, "samples per training environment (thesis: 10,000)")
    test_samples_per_env: int = opt(10_000, "samples per test / validation environment")
    dim_cg: int = opt(3, "dimension of the global causal latent Z_C^g")
    dim_cu: int = opt(3, "dimension of the client-specific causal latent Z_C^u")
    dim_s: int = opt(6, "dimension of the spurious latent Z_S")
    mu_var: float = opt(1.5, "μ_cg, μ_cu ~ N(0, mu_var·I)")
    mu_s_var: float = opt(0.75, "μ_s ~ N(m_s, mu_s_var·I), one per environment")
    mu_s_centre_var: float = opt(
        0.0,
        "m_s ~ N(0, mu_s_centre_var·I): the shared mean of the environments' μ_s prior, drawn "
        "once with the dataset (0 = a zero-mean prior)",
    )
    sigma_cg: float = opt(2.0, "noise std of Z_C^g")
    sigma_cu: float = opt(2.0, "noise std of Z_C^u")
    sigma_s: float = opt(1.0, "noise std of Z_S")
    means_seed: int = opt(
        THESIS_MEANS_SEED,
        "seed of the dataset's fixed draw of W, μ_cg and μ_cu (default: the draw whose oracle "
        "is the thesis's ≈97.5 %); -1 = draw them from the run seed",
    )

    def __post_init__(self) -> None:
        for key in ("clients", "train_envs", "test_envs", "samples_per_env"):
            require(getattr(self, key) >= 1, f"scenario.{key}={getattr(self, key)} must be >= 1")
        require(self.val_envs >= 0, f"scenario.val_envs={self.val_envs} must be >= 0")
        require(
            self.train_envs <= self.clients,
            f"scenario.train_envs={self.train_envs} exceeds scenario.clients={self.clients} "
            "(every client holds one training environment)",
        )
        per_client = self.samples_per_env * self.train_envs // self.clients
        require(per_client >= 1, "scenario.samples_per_env is too small to give every client data")
        require(
            self.test_samples_per_env >= self.clients,
            f"scenario.test_samples_per_env={self.test_samples_per_env} must give each of the "
            f"{self.clients} clients at least one sample",
        )
        for key in ("dim_cg", "dim_cu", "dim_s"):
            require(getattr(self, key) >= 0, f"scenario.{key} must be >= 0")
        require(self.dim_cg + self.dim_cu >= 1, "the causal latents need at least one dimension")
        for key in ("mu_var", "mu_s_var", "mu_s_centre_var"):
            require(getattr(self, key) >= 0, f"scenario.{key} must be >= 0")
        for key in ("sigma_cg", "sigma_cu", "sigma_s"):
            require(getattr(self, key) > 0, f"scenario.{key} must be positive")
        require(0.0 < self.participation <= 1.0, "scenario.participation must lie in (0, 1]")
        require(
            self.means_seed >= -1,
            f"scenario.means_seed={self.means_seed} must be a seed >= 0, or -1 for the run seed",
        )

    @property
    def dim(self) -> int:
        return self.dim_cg + self.dim_cu + self.dim_s


def _generate(o: SCMOptions, w, mu_cg, mu_cu, mu_s, clients, rng) -> tuple[np.ndarray, ...]:
    """Samples of one environment (mean ``mu_s``) for ``clients`` (client id per sample)."""
    n = len(clients)
    y = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    z = rng.standard_normal((n, o.dim))
    z[:, : o.dim_cg] = y[:, None] * mu_cg + o.sigma_cg * z[:, : o.dim_cg]
    cu = slice(o.dim_cg, o.dim_cg + o.dim_cu)
    z[:, cu] = y[:, None] * mu_cu[clients] + o.sigma_cu * z[:, cu]
    z[:, o.dim_cg + o.dim_cu :] = y[:, None] * mu_s + o.sigma_s * z[:, o.dim_cg + o.dim_cu :]
    return (z @ w.T).astype(np.float32), ((y + 1) / 2).astype(np.int64)


def _even(total: int, clients: int) -> np.ndarray:
    sizes = np.full(clients, total // clients, dtype=np.int64)
    sizes[: total % clients] += 1
    return sizes


def oracle_accuracy(info: dict) -> np.ndarray:
    """Per-client accuracy (%) of the Bayes classifier on the causal latents
    [Z_C^g, Z_C^u]: Φ(√(‖μ_cg‖²/σ_cg² + ‖μ_cu‖²/σ_cu²)), the same in every environment."""
    mu_cg = np.asarray(info["mu_cg"])
    mu_cu = np.asarray(info["mu_cu"])
    snr2 = (mu_cg**2).sum() / info["sigma_cg"] ** 2 + (mu_cu**2).sum(1) / info["sigma_cu"] ** 2
    return np.array([100.0 * 0.5 * (1 + math.erf(math.sqrt(s / 2))) for s in snr2])


def empirical_oracle(info: dict, split: Split) -> np.ndarray:
    """Per-client accuracy (%) of that Bayes classifier applied to ``split``'s stored data
    (latents recovered as W⁻¹x)."""
    w = np.asarray(info["mixing"])
    z = np.linalg.solve(w, split.x.double().numpy().T).T
    dg, du = len(info["mu_cg"]), len(info["mu_cu"][0])
    mu_cg, mu_cu = np.asarray(info["mu_cg"]), np.asarray(info["mu_cu"])
    out = np.full(split.num_clients, np.nan)
    for u in range(split.num_clients):
        lo, hi = int(split.offsets[u]), int(split.offsets[u + 1])
        if hi == lo:
            continue
        score = z[lo:hi, :dg] @ mu_cg / info["sigma_cg"] ** 2
        score = score + z[lo:hi, dg : dg + du] @ mu_cu[u] / info["sigma_cu"] ** 2
        out[u] = 100.0 * float(((score > 0).astype(np.int64) == split.y[lo:hi].numpy()).mean())
    return out


@register_scenario(
    "scm",
    SCMOptions,
    "synthetic linear SCM (thesis §4.5.1): causal global/client latents, spurious env latent; "
    "analytic oracle",
)
def build_scm(o: SCMOptions, seed: int, data_dir: Path | None) -> FederatedData:
    def rng(purpose: str, *extra: int) -> np.random.Generator:
        return P.make_rng(seed, f"scm/{purpose}", *extra)

    g = P.make_rng(seed if o.means_seed < 0 else o.means_seed, "scm/parameters")
    w = g.normal(0.0, 1.0 / math.sqrt(o.dim), (o.dim, o.dim))
    mu_cg = g.normal(0.0, math.sqrt(o.mu_var), o.dim_cg)
    mu_cu = g.normal(0.0, math.sqrt(o.mu_var), (o.clients, o.dim_cu))
    centre = g.normal(0.0, math.sqrt(o.mu_s_centre_var), o.dim_s)
    env_means = rng("env-means")
    spread = math.sqrt(o.mu_s_var)
    mu_train = centre + env_means.normal(0.0, spread, (o.train_envs, o.dim_s))
    mu_val = centre + env_means.normal(0.0, spread, (o.val_envs, o.dim_s))
    mu_test = centre + rng("test-env-means").normal(0.0, spread, (o.test_envs, o.dim_s))

    client_env = balanced_assignment(o.clients, o.train_envs, rng("client-envs"))
    xs, ys, envs, owners = [], [], [], []
    for e in range(o.train_envs):
        holders = np.flatnonzero(client_env == e)
        clients = np.repeat(holders, _even(o.samples_per_env, len(holders)))
        x, y = _generate(o, w, mu_cg, mu_cu, mu_train[e], clients, rng("train", e))
        xs.append(x), ys.append(y), envs.append(np.full(len(y), e)), owners.append(clients)
    owner = np.concatenate(owners)
    order = np.argsort(owner, kind="stable")
    offsets = np.zeros(o.clients + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=o.clients), out=offsets[1:])
    train = Split(
        torch.from_numpy(np.concatenate(xs)[order]),
        torch.from_numpy(np.concatenate(ys)[order]),
        torch.from_numpy(offsets),
        torch.from_numpy(np.concatenate(envs)[order]),
    )

    test_sizes = _even(o.test_samples_per_env, o.clients)
    test_clients = np.repeat(np.arange(o.clients), test_sizes)
    test_offsets = np.zeros(o.clients + 1, dtype=np.int64)
    np.cumsum(test_sizes, out=test_offsets[1:])

    def environment(mu_s, purpose: str, index: int) -> Split:
        x, y = _generate(o, w, mu_cg, mu_cu, mu_s, test_clients, rng(purpose, index))
        return Split(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(test_offsets))

    width = len(str(max(o.test_envs, o.val_envs) - 1))
    test = {f"e{i:0{width}d}": environment(mu_test[i], "test", i) for i in range(o.test_envs)}
    val = {f"val{i:0{width}d}": environment(mu_val[i], "val", i) for i in range(o.val_envs)}
    info = {
        "mixing": w.tolist(),
        "mu_cg": mu_cg.tolist(),
        "mu_cu": mu_cu.tolist(),
        "sigma_cg": o.sigma_cg,
        "sigma_cu": o.sigma_cu,
        "mu_s_centre": centre.tolist(),
        "mu_s_train": mu_train.tolist(),
        "client_train_env": [f"train{e}" for e in client_env],
    }
    per_client = oracle_accuracy(info)
    info["oracle_accuracy_per_client"] = per_client.tolist()
    info["oracle_accuracy"] = float(per_client.mean())
    info["oracle_rule"] = (
        "Bayes classifier of each client on [Z_C^g, Z_C^u]: accuracy "
        "Φ(√(‖μ_cg‖²/σ_cg² + ‖μ_cu‖²/σ_cu²)), identical in every environment"
    )
    return FederatedData(
        name="scm",
        num_classes=2,
        input_shape=(o.dim,),
        train=train,
        test=test,
        val=val,
        train_env_names=[f"train{e}" for e in range(o.train_envs)],
        default_model="mlp",
        participation=o.participation,
        info=info,
    )
