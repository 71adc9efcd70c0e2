"""The papers' summary numbers from a per-client × per-environment accuracy matrix.

For each test environment the accuracy is averaged over clients (unweighted, clients
without data in that environment skipped); worst = min and average = mean over
environments (thesis §4.5.3, §5.6.2); per-client accuracy = mean over that client's
environments, worst_client = its minimum (UCFL Table II). All values are percentages.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import Tensor


def summarize(acc: Tensor, env_names: list[str]) -> dict:
    """``acc`` [N, E] in percent with NaN where a client has no data for an environment."""
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
    }


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


def over_seeds(summaries: list[dict]) -> tuple[dict, dict]:
    """Mean and standard deviation over seeds of each summary number (worst, average,
    worst_client, every per_env entry and every per_client entry)."""

    def combine(fn):
        out = {}
        for key in ("worst", "average", "worst_client"):
            out[key] = fn([s[key] for s in summaries])
        envs = summaries[0]["per_env"]
        out["per_env"] = {e: fn([s["per_env"][e] for s in summaries]) for e in envs}
        n = len(summaries[0]["per_client"])
        out["per_client"] = [fn([s["per_client"][i] for s in summaries]) for i in range(n)]
        return out

    return combine(lambda v: mean_std(v)[0]), combine(lambda v: mean_std(v)[1])
