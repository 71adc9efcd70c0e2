"""Stream a run to experiment trackers besides the run store: ``tracking = ["tensorboard",
"mlflow"]`` (``--set tracking=tensorboard,mlflow``) sends the resolved config, every round's
figures and the final per-environment table to TensorBoard and/or MLflow as the run goes.

The run store stays the record; a tracker is a view of it. Each tracker run is named by the
store's run id, so a resumed run continues the same TensorBoard folder and MLflow run, and
rounds the tracker already holds are never written twice (it catches up from the store).
Where files go: ``tracking.<option>`` (:class:`TrackingOptions`); docs/runs.md."""

from __future__ import annotations

import importlib.util
import re
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FedshiftError
from ..options import opt
from .sink import Sink

TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # name → module it needs


@dataclass(frozen=True)
class TrackingOptions:
    tensorboard_dir: str = opt(
        "", "TensorBoard log folder, one subfolder per run ('' = tensorboard/ beside the store)"
    )
    mlflow_uri: str = opt(
        "",
        "MLflow tracking URI ('' = $MLFLOW_TRACKING_URI, else sqlite mlflow.db beside the store)",
    )
    mlflow_experiment: str = opt("fedshift", "MLflow experiment the runs are logged under")


def check_trackers(names: list[str]) -> None:
    """Refuse an unknown tracker, and one whose library is not installed, in one sentence
    naming the pip extra, before anything runs."""
    from ..errors import did_you_mean

    for name in names:
        if name not in TRACKERS:
            hint = did_you_mean(name, list(TRACKERS))
            raise FedshiftError(
                f"tracking={name!r} is not a tracker{hint}; use {', '.join(TRACKERS)}"
            )
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise FedshiftError(
                f"tracking={name} needs the {name} package, which is not installed here: "
                f"pip install 'fedshift[{name}]'"
            )


def run_name(config: dict[str, Any], run_id: str | None) -> str:
    """``fedavg-dirichlet-seed0-36b36a37c2``: readable in the trackers' run lists, and the
    same on resume (a run without a store gets a random suffix)."""
    text = f"{config['algorithm']}-{config['scenario']}-seed{config['seed']}"
    return re.sub(r"[^\w.-]", "_", text) + f"-{run_id or secrets.token_hex(5)}"


class Tracking:
    """The trackers of one run. A tracker that fails mid-run is dropped with a warning:
    the run goes on, and the store keeps every round for a later catch-up."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def _each(self, what: str, *args) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, what)(*args)
            except Exception as e:  # a tracker's failure must not cost the training
                self.sinks.remove(sink)
                warnings.warn(
                    f"tracking to {sink.name} stopped ({type(e).__name__}: {e}); the run goes "
                    "on and the run store keeps every round",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def log_round(self, record: dict[str, Any]) -> None:
        self._each("log_round", record)

    def finish(self, metrics: dict[str, Any]) -> None:
        self._each("finish", metrics)

    def close(self, status: str) -> None:
        self._each("close", status)


def open_tracking(
    config: dict[str, Any],
    run_id: str | None,
    base: Path,
    stored_rounds: list[dict[str, Any]] = (),
) -> Tracking | None:
    """The trackers ``config["tracking"]`` names, opened on the run ``run_id`` (resumed
    where they already hold it) and caught up with ``stored_rounds``; None when tracking
    is off. ``base`` is the run store's folder, where the default locations lie."""
    from ..options import build_options

    names = list(config.get("tracking") or [])
    if not names:
        return None
    check_trackers(names)
    prefix = "tracking."
    given = {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}
    opts = build_options(TrackingOptions, given, "tracking")
    name = run_name(config, run_id)
    sinks: list[Sink] = []
    try:
        for tracker in names:
            if tracker == "tensorboard":
                from .tensorboard_sink import TensorBoardSink

                folder = (
                    Path(opts.tensorboard_dir) if opts.tensorboard_dir else base / "tensorboard"
                )
                sinks.append(TensorBoardSink(folder / name, config))
            else:
                from .mlflow_sink import MlflowSink

                sinks.append(MlflowSink(opts, base, run_id, name, config))
    except BaseException:
        for sink in sinks:
            sink.close("failed")
        raise
    tracking = Tracking(sinks)
    for record in stored_rounds:
        tracking.log_round(record)
    return tracking
