"""The papers' summary numbers from a per-client × per-environment accuracy matrix.

For each test environment the accuracy is averaged over clients (unweighted, clients
without data in that environment skipped); worst = min and average = mean over
environments (thesis §4.5.3, §5.6.2); per-client accuracy = mean over that client's
environments, worst_client = its minimum (UCFL Table II). All values are percentages.
``average_pooled`` weights clients by their samples instead (Σ correct / Σ samples per
environment, then the mean over environments): the accuracy of the pFedMe code that the
thesis's Table 3.1 builds on.

A model can score a respectable worst case by answering one class everywhere (flat at the
majority-class rate). :func:`degeneracy` flags it, so reports never count it as a result:
a client's predictor is *constant* when at least ``CONSTANT_SHARE`` (90 %) of its test predictions
are one class and that share exceeds the share of the client's most common label by
``CONSTANT_MARGIN`` (a client whose labels are 97 % one class may rightly predict it 97 %
of the time); a run is *degenerate* when most clients' predictors are constant, or when
its training loss stays at ln K (chance) over the last rounds, or when its predictors
classify their own training data worse than answering the training data's most common
class (:func:`flag_chance_fit_on_training`): a model that reads a shortcut *backwards*
scores well on a validation environment where the shortcut is reversed, and is neither
constant nor at ln K, but it fails on the data it was trained on; and, since 2026-11-30,
when they classify it no better than that, within ``NEAR_CHANCE_MARGIN`` points above it: a
model that has learned next to nothing scores about the majority rate everywhere, which on
a validation environment where the shortcut is reversed beats every model that reads the
shortcut (FedPIN's selection, docs/results/thesis-5.1-cmnist8-fedpin-select). And a run
is degenerate when its predictors' logits have blown up (:func:`flag_saturated_logits`): on
most of their own training rows the top logit exceeds the runner-up by more than
``SATURATION_GAP``, so the softmax is exactly one-hot in floating point and the risk passes
no gradient there — a divergence that stayed finite (FedSDR's prediction estimator at
γ ≥ 10⁴: logit gaps of 10⁸–10⁹ after its first steps, docs/methods/invariant.md).
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

# a predictor answering one class for ≥ 90 % of its test rows … (0.95 until 2026-11-25:
# FedPIN personal models at 91–97 % one class on balanced CMNIST clients, 91 % of inputs
# mapped to all-zero features, passed it with a worst case of 47 % — docs/methods/invariant.md)
CONSTANT_SHARE = 0.90
CONSTANT_MARGIN = 0.05  # … 5 points more often than that client's most common label
CHANCE_TOLERANCE = 0.01  # training loss within 1 % of ln K counts as "at chance"
# training-data accuracy this many points under the most common class's share: backwards
BELOW_CHANCE_MARGIN = 5.0
# … or no more than this many points above it: learned next to nothing. The same 5 points
# the other side; every exported run under docs/results/ within it on 2026-11-30 was
# already degenerate by another rule but one (FedPIN at γ = 100, fit 50.9 against 50.3)
NEAR_CHANCE_MARGIN = 5.0
# a logit gap this large makes exp(−gap) 0 in float32 and float64 alike (exp(−745) already
# is): the cross-entropy's gradient is exactly 0 on a correct row, and a model trained with
# it does not get there by the risk (measured: no row above it for any pinned algorithm but
# the FedSDR variants at their default γ = 10⁴; FedSDR at γ = 1 and 3 median gaps of 7.7–9.1,
# at γ ≥ 10⁴ 10⁵–10⁹)
SATURATION_GAP = 1000.0
# … on more than this share of the training rows: the run's logits have blown up
SATURATED_SHARE = 50.0
# the headline numbers of a run's summary: what a paper table may publish and `reproduce`
# compares, and what a diverged run has none of
HEADLINE_METRICS = ("worst", "average", "worst_client", "average_pooled")


def summarize(
    acc: Tensor,
    env_names: list[str],
    counts: tuple[Tensor, Tensor] | None = None,
    constant: Tensor | None = None,
) -> dict:
    """``acc`` [N, E] in percent with NaN where a client has no data for an environment;
    ``counts`` (correct, total) [N, E] add the sample-weighted figures, ``constant`` [N]
    (:func:`constant_clients`) the degeneracy check."""
    a = acc.double().numpy()
    with warnings.catch_warnings():  # an all-NaN row/column (no data) is allowed: it gives None
        warnings.simplefilter("ignore", RuntimeWarning)
        per_env_vals = np.nanmean(a, axis=0)
        per_client_vals = np.nanmean(a, axis=1)
    per_env = {e: _clean(v) for e, v in zip(env_names, per_env_vals, strict=True)}
    env_ok = [v for v in per_env.values() if v is not None]
    client_ok = [v for v in map(_clean, per_client_vals) if v is not None]
    return {
        "worst": min(env_ok) if env_ok else None,
        "average": float(np.mean(env_ok)) if env_ok else None,
        "worst_client": min(client_ok) if client_ok else None,
        "per_env": per_env,
        "per_client": [_clean(v) for v in per_client_vals],
        **(_pooled(*counts, env_names) if counts is not None else {}),
        **(_constant_summary(constant) if constant is not None else {}),
    }


def _pooled(correct: Tensor, total: Tensor, env_names: list[str]) -> dict:
    """Σ correct / Σ samples over clients per environment, and its worst and mean."""
    c, t = correct.sum(0).double(), total.sum(0).double()
    per_env = {
        e: (100.0 * float(ci / ti) if ti > 0 else None)
        for e, ci, ti in zip(env_names, c, t, strict=True)
    }
    ok = [v for v in per_env.values() if v is not None]
    return {
        "per_env_pooled": per_env,
        "worst_pooled": min(ok) if ok else None,
        "average_pooled": float(np.mean(ok)) if ok else None,
    }


def constant_clients(predicted: Tensor, labels: Tensor) -> Tensor:
    """[N] bool: client i's predictor answers one class (see the module docstring), from
    its predicted-class and label counts [N, K] summed over the test environments."""
    n_pred = predicted.sum(1).clamp(min=1).double()
    n_lab = labels.sum(1).clamp(min=1).double()
    pred_share = predicted.max(1).values.double() / n_pred
    label_share = labels.max(1).values.double() / n_lab
    has_data = predicted.sum(1) > 0
    return has_data & (pred_share >= CONSTANT_SHARE) & (pred_share >= label_share + CONSTANT_MARGIN)


def _constant_summary(constant: Tensor) -> dict:
    n = int(constant.numel())
    k = int(constant.sum())
    degenerate = n > 0 and 2 * k > n
    why = f"{k} of {n} clients' models predict one class everywhere" if degenerate else None
    return {"constant_clients": k, "degenerate": degenerate, "degenerate_why": why}


def loss_at_chance(losses: list[float], num_classes: int, rounds: int) -> bool:
    """The training loss stayed within ``CHANCE_TOLERANCE`` of ln K over the last
    max(3, 10 %) rounds: nothing was learned (a constant predictor's risk)."""
    tail = max(3, math.ceil(0.1 * rounds))
    if num_classes < 2 or len(losses) < tail:
        return False
    chance = math.log(num_classes)
    last = losses[-tail:]
    return all(math.isfinite(v) and abs(v - chance) <= CHANCE_TOLERANCE * chance for v in last)


def flag_chance_loss(metrics: dict, losses: list[float], num_classes: int) -> dict:
    """Mark ``metrics`` degenerate (in place, and returned) when the loss stayed at ln K."""
    if metrics and loss_at_chance(losses, num_classes, len(losses)):
        metrics["degenerate"] = True
        why = f"training loss stayed at ln {num_classes} = {math.log(num_classes):.4f}"
        metrics["degenerate_why"] = "; ".join(filter(None, [metrics.get("degenerate_why"), why]))
    return metrics


def training_fit(train: EvalCounts) -> dict:
    """The predictors on their own training rows (pooled: Σ correct / Σ rows) beside the
    share of the training rows' most common class (what answering it everywhere scores)."""
    total = int(train.total.sum())
    if total == 0:
        return {}
    return {
        "train_accuracy_pooled": 100.0 * int(train.correct.sum()) / total,
        "train_majority_share": 100.0 * int(train.labels.sum(0).max()) / total,
        "train_saturated_share": 100.0 * int(train.saturated.sum()) / total,
    }


def flag_training_fit(metrics: dict) -> dict:
    """The degeneracy rules that read the predictors' fit to their own training rows
    (:func:`training_fit`): learned backwards or next to nothing, or logits blown up."""
    return flag_saturated_logits(flag_chance_fit_on_training(metrics))


def flag_saturated_logits(metrics: dict) -> dict:
    """Mark ``metrics`` degenerate (in place, and returned) when the predictors' logits have
    blown up: more than ``SATURATED_SHARE`` % of their training rows have a top-logit gap
    above ``SATURATION_GAP``."""
    share = metrics.get("train_saturated_share")
    if share is None or share <= SATURATED_SHARE:
        return metrics
    metrics["degenerate"] = True
    why = (
        f"its models' logits have blown up: on {share:.0f} % of their training rows the top "
        f"logit exceeds the next by more than {SATURATION_GAP:g} (a divergence that stayed "
        "finite; the risk passes no gradient there)"
    )
    metrics["degenerate_why"] = "; ".join(filter(None, [metrics.get("degenerate_why"), why]))
    return metrics


def flag_chance_fit_on_training(metrics: dict) -> dict:
    """Mark ``metrics`` degenerate (in place, and returned) when the predictors' accuracy on
    their own training data is more than ``BELOW_CHANCE_MARGIN`` points under the majority
    share (they learned it backwards) or no more than ``NEAR_CHANCE_MARGIN`` points above it
    (they learned next to nothing). Pooled over clients and against the union's most common
    class, so that a global model on a skewed client is not called backwards for missing
    that client's own majority."""
    acc, share = metrics.get("train_accuracy_pooled"), metrics.get("train_majority_share")
    if acc is None or share is None or acc >= share + NEAR_CHANCE_MARGIN:
        return metrics
    metrics["degenerate"] = True
    if acc < share - BELOW_CHANCE_MARGIN:
        why = (
            f"its models score {acc:.1f} % on their own training data, under the {share:.1f} % "
            "of answering the most common class (a shortcut learned backwards?)"
        )
    else:
        why = (
            f"its models score {acc:.1f} % on their own training data, within "
            f"{NEAR_CHANCE_MARGIN:g} points of the {share:.1f} % of answering the most common "
            "class: they learned next to nothing from it"
        )
    metrics["degenerate_why"] = "; ".join(filter(None, [metrics.get("degenerate_why"), why]))
    return metrics


def refresh_fit_verdict(metrics: dict | None) -> dict | None:
    """A stored run's metrics under the current training-fit rules (in place, and returned):
    a rule added after the run finished applies to it from the fit it recorded, without a
    re-evaluation. A run already degenerate keeps its verdict and reasons as stored."""
    if metrics and not metrics.get("degenerate"):
        flag_training_fit(metrics)
    return metrics


def _clean(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(v)


def accuracy_percent(correct: Tensor, total: Tensor) -> Tensor:
    out = torch.full(correct.shape, float("nan"), dtype=torch.float64)
    ok = total > 0
    out[ok] = 100.0 * correct[ok].double() / total[ok].double()
    return out


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (std 0 for a single seed)."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def _at(values: list, i: int):
    return values[i] if i < len(values) else None


def over_seeds(summaries: list[dict]) -> tuple[dict, dict]:
    """Mean and standard deviation over seeds of each summary number (worst, average,
    worst_client, the pooled figures, every per_env entry and every per_client entry). The
    mean is ``degenerate`` when any seed is (``degenerate_seeds`` counts them): an average
    over seeds must not hide a seed that learned nothing. A seed without a number (a
    diverged run: None, no environments) is left out of that number's mean."""

    def combine(fn):
        out = {}
        for key in ("worst", "average", "worst_client", "worst_pooled", "average_pooled"):
            if any(key in s for s in summaries):
                out[key] = fn([s.get(key) for s in summaries])
        envs = [s.get("per_env", {}) for s in summaries]
        out["per_env"] = {
            e: fn([d.get(e) for d in envs]) for e in dict.fromkeys(itertools.chain(*envs))
        }
        clients = [s.get("per_client", []) for s in summaries]
        n = max(map(len, clients))
        out["per_client"] = [fn([_at(c, i) for c in clients]) for i in range(n)]
        return out

    mean = combine(lambda v: mean_std(v)[0])
    if any("degenerate" in s for s in summaries):
        bad = [s for s in summaries if s.get("degenerate")]
        mean["degenerate"] = bool(bad)
        mean["degenerate_seeds"] = len(bad)
        mean["degenerate_why"] = bad[0].get("degenerate_why") if bad else None
    return mean, combine(lambda v: mean_std(v)[1])


def combine_folds(metrics: list[dict], key: str, values: list) -> dict:
    """The runs of a table's folds (one run per value of config ``key``, e.g. each held-out
    domain) as one result: each run's average accuracy is an environment (``held_out=0``),
    so ``worst`` is the lowest fold and ``average`` their mean (``reproduce`` and ``sweep
    --folds`` alike)."""
    label = key.split(".")[-1]
    per_env = {f"{label}={v}": m["average"] for v, m in zip(values, metrics, strict=True)}
    ok = [v for v in per_env.values() if v is not None]
    clients = [m["worst_client"] for m in metrics if m["worst_client"] is not None]
    bad = [m for m in metrics if m.get("degenerate")]
    pooled = [m["average_pooled"] for m in metrics if m.get("average_pooled") is not None]
    return {
        "average_pooled": sum(pooled) / len(pooled) if pooled else None,
        "worst": min(ok) if ok else None,
        "average": sum(ok) / len(ok) if ok else None,
        "worst_client": min(clients) if clients else None,
        "per_env": per_env,
        "degenerate": bool(bad),
        "degenerate_why": bad[0].get("degenerate_why") if bad else None,
    }


@dataclass
class EvalCounts:
    """What one evaluation counted: correct and total [N, E] per client and environment,
    predicted and true class counts [N, K] per client summed over the environments, and the
    rows with saturated logits [N, E] (``SATURATION_GAP``)."""

    correct: Tensor
    total: Tensor
    predicted: Tensor
    labels: Tensor
    saturated: Tensor

    @classmethod
    def zeros(cls, clients: int, envs: int, classes: int) -> EvalCounts:
        def z(*shape):
            return torch.zeros(*shape, dtype=torch.int64)

        return cls(
            z(clients, envs),
            z(clients, envs),
            z(clients, classes),
            z(clients, classes),
            z(clients, envs),
        )

    def percent(self) -> Tensor:
        return accuracy_percent(self.correct, self.total)

    def summary(self, env_names: list[str]) -> tuple[Tensor, dict]:
        """The [N, E] accuracy and its :func:`summarize` with pooled figures and the
        degeneracy check."""
        acc = self.percent()
        constant = constant_clients(self.predicted, self.labels)
        return acc, summarize(acc, env_names, (self.correct, self.total), constant)
