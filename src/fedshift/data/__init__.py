"""Data: raw dataset loaders (files on disk → tensors), partitioners, and the registered
scenarios that turn them into :class:`FederatedData`. Nothing here trains."""

from . import scenarios  # noqa: F401  (registers the built-in scenarios)
from .digits import load_digits
from .federated import FederatedData, Split
from .idx import load_fashion_mnist, load_idx_dataset, load_mnist, read_idx
from .registry import SCENARIOS, build_scenario, register_scenario
from .root import data_root, dataset_files

__all__ = [
    "FederatedData",
    "SCENARIOS",
    "Split",
    "build_scenario",
    "data_root",
    "dataset_files",
    "load_digits",
    "load_fashion_mnist",
    "load_idx_dataset",
    "load_mnist",
    "read_idx",
    "register_scenario",
]
