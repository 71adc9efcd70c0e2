"""Simplex projection and the simplex QP (src/fedshift/algorithms/common/simplex.py), by hand
and by brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedshift.algorithms.common.simplex import project_simplex, simplex_qp


def brute_force_simplex_min(p, step=0.005):
    best = np.inf
    m = p.shape[0]
    grid = np.arange(0, 1 + 1e-9, step)
    for head in itertools.product(grid, repeat=m - 1):
        last = 1 - sum(head)
        if last < -1e-12:
            continue
        a = np.array([*head, max(last, 0.0)])
        best = min(best, a @ p @ a)
    return best


def test_simplex_qp_matches_brute_force_and_closed_form():
    rng = np.random.default_rng(0)
    for _ in range(3):
        b = rng.normal(size=(3, 3))
        p = b @ b.T + np.diag(rng.uniform(0, 1, 3))
        a = simplex_qp(p)
        assert a.min() >= 0 and a.sum() == pytest.approx(1.0)
        assert a @ p @ a <= brute_force_simplex_min(p) + 1e-9
    # two clients: a_1 = (P22 − P12) / (P11 + P22 − 2 P12), clipped to [0, 1]
    p = np.array([[2.0, 0.5], [0.5, 1.0]])
    a1 = (1.0 - 0.5) / (2.0 + 1.0 - 1.0)
    np.testing.assert_allclose(simplex_qp(p), [a1, 1 - a1], atol=1e-6)
    np.testing.assert_allclose(
        simplex_qp(np.array([[1.0, 3.0], [3.0, 10.0]])), [1.0, 0.0], atol=1e-6
    )


def test_project_simplex_by_hand():
    torch.testing.assert_close(
        project_simplex(torch.tensor([1.0, 0.5, -1.0])), torch.tensor([0.75, 0.25, 0.0])
    )
    torch.testing.assert_close(project_simplex(torch.tensor([2.0, 0.0])), torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(project_simplex(torch.tensor([0.2, 0.8])), torch.tensor([0.2, 0.8]))
