"""Algorithms, one module per method; importing this package registers them all."""

from ..registry_import import import_submodules
from .base import ALGORITHMS, Algorithm, ClientResult, Payload, Prediction, RoundInfo

import_submodules(__name__, __path__)

__all__ = ["ALGORITHMS", "Algorithm", "ClientResult", "Payload", "Prediction", "RoundInfo"]
