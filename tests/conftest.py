"""Shared fixtures: the real offline datasets in ``shared/datasets`` beside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The data root holding ``mnist/`` and ``fashion_mnist/`` (skips when absent)."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS
