"""Randomness derived from (run seed, round, client id, purpose), never from a global stream.

This is what makes a run give the same numbers whatever the cohort size or the order in
which clients are visited (and under Flower, where each client runs elsewhere).
"""

from __future__ import annotations

import numpy as np

from ..seeding import purpose_code, stream


def generator(seed: int, round_: int, client: int, purpose: str) -> np.random.Generator:
    """A numpy generator private to one (seed, round, client, purpose) tuple."""
    return stream(int(seed), int(round_) + 1, int(client) + 1, purpose_code(purpose))


def torch_seed(seed: int, round_: int, client: int, purpose: str) -> int:
    """An int seed for torch generators, derived like :func:`generator`."""
    return int(generator(seed, round_, client, purpose).integers(0, 2**62))
