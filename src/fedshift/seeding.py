"""Random streams named by integers: every seeded draw in fedshift (partitions, scenarios,
minibatch orders, noise, client sampling) comes from a stream private to the words that
name it, never from a global generator, so adding a draw in one place never shifts another.

The callers keep their own word layouts (``data.partition.make_rng``: seed, purpose,
extras; ``engine.rng.generator``: seed, round + 1, client + 1, purpose), which fix the
numbers of every stored run."""

from __future__ import annotations

import zlib

import numpy as np


def purpose_code(purpose: str) -> int:
    """A purpose string as a word of a stream's name."""
    return zlib.crc32(purpose.encode())


def stream(*words: int) -> np.random.Generator:
    """The generator named by ``words`` (non-negative integers below 2**64)."""
    return np.random.default_rng(np.random.SeedSequence([int(w) for w in words]))
