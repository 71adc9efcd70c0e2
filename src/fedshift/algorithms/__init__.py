"""Algorithms, one module per method; importing this package registers them all."""

from . import fedavg, fedprox, ftfa, local  # noqa: F401  (registration)
from .base import ALGORITHMS, Algorithm, ClientResult, Payload, Prediction, RoundInfo

__all__ = ["ALGORITHMS", "Algorithm", "ClientResult", "Payload", "Prediction", "RoundInfo"]
