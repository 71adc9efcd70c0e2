"""The signature view's shortcut directions (Lemma 4.4.1's Z_S ⊥ U | Y, E) on features whose
environment and client structure is known."""

from __future__ import annotations

import torch

from fedshift.algorithms.common.shortcut_signature import (
    group_means,
    shortcut_directions,
    within_covariance,
)


def synthetic_means(seed: int = 0, clients_per_env: int = 6, envs: int = 5):
    """Class-conditional means [N, E, K, d=4] of features h = (shared, personal, shortcut,
    noise): the shortcut coordinate moves with the environment, the personal one with the
    client, the shared one with the class only."""
    g = torch.Generator().manual_seed(seed)
    n = clients_per_env * envs
    means = torch.zeros(n, envs, 2, 4, dtype=torch.float64)
    counts = torch.zeros(n, envs, 2, dtype=torch.float64)
    env_shift = torch.randn(envs, generator=g, dtype=torch.float64)
    for u in range(n):
        e = u // clients_per_env
        personal = torch.randn((), generator=g, dtype=torch.float64)
        for k, sign in enumerate((-1.0, 1.0)):
            noise = 0.01 * torch.randn(4, generator=g, dtype=torch.float64)
            means[u, e, k] = (
                sign
                * torch.stack(
                    [
                        torch.tensor(1.0, dtype=torch.float64),
                        personal,
                        env_shift[e],
                        torch.tensor(0.0),
                    ]
                )
                + noise
            )
            counts[u, e, k] = 50
    return means, counts


def test_directions_pick_the_environment_coordinate_only():
    means, counts = synthetic_means()
    within = torch.eye(4, dtype=torch.float64)
    proj = shortcut_directions(means, counts, within, ridge=0.01, threshold=5.0)
    kept = proj[:, proj.abs().sum(0) > 0]
    assert kept.shape[1] == 1
    direction = kept[:, 0] / kept[:, 0].norm()
    # the shortcut coordinate (index 2), not the personal one that also varies
    assert abs(direction[2].item()) > 0.99


def test_no_directions_without_two_environments():
    means, counts = synthetic_means(envs=1)
    proj = shortcut_directions(means, counts, torch.eye(4, dtype=torch.float64), 0.1, 5.0)
    assert proj.abs().sum() == 0


def test_unreported_clients_are_ignored():
    means, counts = synthetic_means()
    counts[::2] = 0  # half the clients never reported
    means[::2] = 1e6  # whatever their rows hold must not matter
    proj = shortcut_directions(means, counts, torch.eye(4, dtype=torch.float64), 0.01, 5.0)
    kept = proj[:, proj.abs().sum(0) > 0]
    assert kept.shape[1] == 1 and abs(kept[2, 0] / kept[:, 0].norm()) > 0.99


def test_within_covariance_by_hand():
    # one client, two groups: group 0 holds h = 0 and 2, group 1 holds h = 5 (1-d features)
    outer = torch.tensor([[[0.0 + 4.0 + 25.0]]])
    sums = torch.tensor([[[2.0], [5.0]]])
    counts = torch.tensor([[2.0, 1.0]])
    # deviations from the group means: −1, +1, 0 → covariance 2/3
    got = within_covariance(outer, sums, counts)
    assert abs(got.item() - 2 / 3) < 1e-6
    torch.testing.assert_close(group_means(sums, counts), torch.tensor([[[1.0], [5.0]]]))
