"""Shared fixtures: the real offline datasets in ``shared/datasets`` beside the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# ../shared/datasets beside the checkout (CI), else the data root named by $FEDSHIFT_DATA
SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
if not SHARED_DATASETS.is_dir() and os.environ.get("FEDSHIFT_DATA"):
    SHARED_DATASETS = Path(os.environ["FEDSHIFT_DATA"])


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The data root holding ``mnist/`` and ``fashion_mnist/`` (skips when absent)."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"shared datasets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS
