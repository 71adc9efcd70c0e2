"""What every tracker writes, and how: the figures of a round and of the final evaluation
as flat ``name → number`` maps, each round written once."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

ROUND_KEYS = ("loss", "val", "bytes_up", "bytes_down", "time_s")
SUMMARY_KEYS = ("worst", "average", "worst_client")


def round_scalars(record: dict[str, Any]) -> dict[str, float]:
    """A stored round (or a ``RoundRecord``'s fields) as the trackers' scalars: the names
    of ``fs.load_rounds``, with ``per_env/<env>`` for each test environment (accuracy %) and
    ``extras/<name>`` for each number a method records in the round's extras."""
    metrics = record.get("metrics") or {}
    out = {k: record.get(k) for k in ROUND_KEYS}
    out.update({k: metrics.get(k) for k in SUMMARY_KEYS})
    out.update({f"per_env/{e}": v for e, v in (metrics.get("per_env") or {}).items()})
    # a method's own per-round figures (FedSDR's clamp, DRFA's largest λ …): the numbers
    # only, not lists, maps or flags
    extras = record.get("extras") or {}
    out.update(
        {
            f"extras/{k}": v
            for k, v in extras.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    )
    return {k: float(v) for k, v in out.items() if v is not None}


def final_scalars(metrics: dict[str, Any]) -> dict[str, float]:
    out = {f"final/{k}": metrics.get(k) for k in SUMMARY_KEYS}
    out.update({f"final/per_env/{e}": v for e, v in (metrics.get("per_env") or {}).items()})
    return {k: float(v) for k, v in out.items() if v is not None}


def final_table(metrics: dict[str, Any]) -> str:
    """The final accuracy table (Markdown; both trackers render it)."""

    def cell(v) -> str:
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"

    rows = [(e, v) for e, v in (metrics.get("per_env") or {}).items()]
    rows += [("**worst**", metrics.get("worst")), ("**average**", metrics.get("average"))]
    rows += [("**worst client**", metrics.get("worst_client"))]
    lines = ["| test environment | accuracy % |", "|---|---|"]
    return "\n".join(lines + [f"| {e} | {cell(v)} |" for e, v in rows])


class Sink(ABC):
    """One tracker's view of one run; ``last`` is the last round it holds, so a round
    replayed after a resume (the checkpoint lags the store) is not written again."""

    name = "tracker"
    last = 0

    def log_round(self, record: dict[str, Any]) -> None:
        if record["round"] <= self.last:
            return
        self.write_round(record["round"], round_scalars(record))
        self.last = record["round"]

    @abstractmethod
    def write_round(self, step: int, scalars: dict[str, float]) -> None:
        """Write one round's scalars at step ``step``."""

    @abstractmethod
    def finish(self, metrics: dict[str, Any]) -> None:
        """Write the run's final metrics and per-environment table."""

    @abstractmethod
    def close(self, status: str) -> None:
        """End the tracker's run with the fedshift status (done, interrupted, failed …)."""
