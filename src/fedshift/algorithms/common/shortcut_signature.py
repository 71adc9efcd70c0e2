"""Shortcut directions from FedSDR's first causal signature, Z_S ⊥ U | Y, E (thesis
Lemma 4.4.1): in a feature space h = Ψ(x), the shortcut is what makes the class-conditional
means of h differ *between environments*, while features that differ *between the clients
of one environment* are personal. An analysis of variance of the clients' class-conditional
means finds the directions where the first variation dominates the second.

For each class k and each (client, environment) group g with samples of class k, m_{g,k} is
the mean of h. Between-environment mean square: the scatter of the environment means
m̄_{e,k} (averages over the environment's clients) around their grand mean, per degree of
freedom; within-environment mean square: the scatter of the client means around their
environment mean, per degree of freedom, plus ``ridge`` × the pooled within-class covariance
of h (a floor where few clients share an environment, and a guard against directions of tiny
variance). The generalized eigenvectors of (between, within) whose ratio — an F statistic —
exceeds ``threshold`` span the shortcut (ours, offered as FedSDR's ``signature`` view).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch
from torch import Tensor


def group_means(sums: Tensor, counts: Tensor) -> Tensor:
    """[..., d] means of feature ``sums`` over ``counts`` [...] (0 where a group is empty)."""
    return sums / counts.clamp(min=1.0).unsqueeze(-1)


def within_covariance(outer: Tensor, sums: Tensor, counts: Tensor) -> Tensor:
    """Pooled within-group covariance [d, d] from Σ h hᵀ ``outer`` [C, d, d], the groups'
    feature ``sums`` [C, G, d] and ``counts`` [C, G] (G groups, e.g. environment × class)."""
    means = group_means(sums, counts)
    between = torch.einsum("cg,cgi,cgj->ij", counts, means, means)
    return (outer.sum(0) - between) / counts.sum().clamp(min=1.0)


def shortcut_directions(
    means: Tensor, counts: Tensor, within: Tensor, ridge: float, threshold: float
) -> Tensor:
    """[d, d] projection whose leading columns span the environment-specific directions of h
    (the rest zero). ``means`` [N, E, K, d] class-conditional means of each (client,
    environment) group, ``counts`` [N, E, K] their sizes (0 = no data or never reported),
    ``within`` [d, d] the pooled within-class covariance of h."""
    m = means.double().cpu().numpy()
    present = (counts > 0).cpu().numpy()
    d = m.shape[-1]
    scatter_b, scatter_w = np.zeros((d, d)), np.zeros((d, d))
    dof_b = dof_w = 0
    for k in range(m.shape[2]):
        env_means = []
        for e in range(m.shape[1]):
            rows = m[present[:, e, k], e, k]  # [clients of e holding class k, d]
            if len(rows) == 0:
                continue
            centre = rows.mean(0)
            dev = rows - centre
            scatter_w += dev.T @ dev
            dof_w += len(rows) - 1
            env_means.append((len(rows), centre))
        if len(env_means) < 2:
            continue
        grand = np.mean([c for _, c in env_means], axis=0)
        for n, c in env_means:
            scatter_b += n * np.outer(c - grand, c - grand)
        dof_b += len(env_means) - 1
    proj = torch.zeros(d, d, dtype=within.dtype)
    if dof_b == 0:
        return proj.to(within.device)
    cov = within.double().cpu().numpy()
    ms_w = scatter_w / max(dof_w, 1) + ridge * cov
    ms_w += 1e-9 * max(np.trace(ms_w) / d, 1e-12) * np.eye(d)
    ratio, vectors = scipy.linalg.eigh(scatter_b / dof_b, ms_w)
    keep = np.argsort(ratio)[::-1]
    keep = keep[ratio[keep] > threshold]
    proj[:, : len(keep)] = torch.from_numpy(vectors[:, keep]).to(proj.dtype)
    return proj.to(within.device)
