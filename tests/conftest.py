"""Shared fixtures: the real offline datasets in ``shared/datasets`` beside the repository."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# the shared helpers (toy.py) for the tests in every sub-folder, which mirror src/fedshift/
sys.path.insert(0, str(Path(__file__).parent))

# ../shared/datasets beside the checkout (CI), else the data root named by $FEDSHIFT_DATA
SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
if not SHARED_DATASETS.is_dir() and os.environ.get("FEDSHIFT_DATA"):
    SHARED_DATASETS = Path(os.environ["FEDSHIFT_DATA"])


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A run with ``threads = N`` sets torch's process-wide thread count; put it back after
    each test, so that no test's numbers depend on which tests ran before it."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The data root holding ``mnist/``, ``fashion_mnist/`` and ``pacs_small/`` (beside the
    repository, else ``$FEDSHIFT_DATA`` when it holds them, as in a git worktree; skips when
    absent)."""
    if SHARED_DATASETS.is_dir():
        return SHARED_DATASETS
    env = Path(os.environ.get("FEDSHIFT_DATA", "") or "/nonexistent")
    if (env / "mnist").is_dir():
        return env
    pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
