"""Server-side clustering shared by the clustered / user-centric methods (CGPFL, UCFL, …):
k-means++ and silhouette scores from scikit-learn, cluster-to-model matching from SciPy.

Everything runs on the server over a small matrix (one row per client), in float64 numpy.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score
from torch import Tensor

from ...engine.contract import leaves


def flatten_rows(stacked: Mapping[str, Tensor]) -> np.ndarray:
    """[P, d] float64 matrix: row i = all floating tensors of client i concatenated (a nested
    tree in its flattened order)."""
    parts = [v.detach().reshape(v.shape[0], -1) for v in leaves(stacked) if v.is_floating_point()]
    return torch.cat(parts, 1).double().cpu().numpy()


def kmeans(points: np.ndarray, k: int, seed: int, n_init: int = 10) -> tuple[np.ndarray, float]:
    """k-means++ (Arthur & Vassilvitskii 2007) with ``n_init`` seeded restarts.

    Returns the labels [P] (0..k-1) and the objective Σ_i ‖x_i − c_{label(i)}‖² (inertia).
    ``k`` is clipped to the number of distinct points, as k-means cannot do better.
    """
    k = max(1, min(int(k), len(np.unique(points, axis=0))))
    if k == 1:
        center = points.mean(0, keepdims=True)
        return np.zeros(len(points), np.int64), float(((points - center) ** 2).sum())
    km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed).fit(points)
    return km.labels_.astype(np.int64), float(km.inertia_)


def centroids(points: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Mean of the points of each label 0..k-1 ([k, d]; an empty label gets NaN)."""
    out = np.full((k, points.shape[1]), np.nan)
    for c in range(k):
        if (labels == c).any():
            out[c] = points[labels == c].mean(0)
    return out


def match_to_previous(new_centers: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Index into ``previous`` for each new cluster, minimising the total squared distance
    (Hungarian assignment, SciPy). k-means numbers its clusters arbitrarily each round;
    this keeps cluster c of this round tied to the model that cluster c had before."""
    cost = ((new_centers[:, None, :] - previous[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    out = np.empty(len(new_centers), np.int64)
    out[rows] = cols
    return out


def silhouette_curve(points: np.ndarray, ks: list[int], seed: int) -> dict[int, float]:
    """Mean silhouette score (Rousseeuw 1987) of the k-means++ clustering for each k in ``ks``
    (each 2 ≤ k ≤ P − 1, where the score is defined)."""
    out = {}
    for k in ks:
        labels, _ = kmeans(points, k, seed)
        if len(np.unique(labels)) < 2 or len(np.unique(labels)) >= len(points):
            out[k] = -1.0  # degenerate clustering: no meaningful score
            continue
        out[k] = float(silhouette_score(points, labels))
    return out


def purity(labels: np.ndarray, truth: np.ndarray) -> float:
    """Cluster purity: fraction of points whose cluster's majority true group is their own."""
    total = 0
    for c in np.unique(labels):
        _, counts = np.unique(truth[labels == c], return_counts=True)
        total += counts.max()
    return total / len(labels)
