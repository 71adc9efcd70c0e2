"""MLflow: one MLflow run per fedshift run (tag ``fedshift.run_id``) with the config as
params, a metric per round figure (step = round), the final figures and table. Without a
tracking URI it writes a local SQLite store beside the run store (MLflow 3 keeps its
``./mlruns`` file store only behind an opt-out); browse it with ``mlflow ui
--backend-store-uri sqlite:///runs/mlflow.db``."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from ..errors import FedshiftError
from .sink import Sink, final_scalars, final_table

STATUS = {"interrupted": "KILLED", "failed": "FAILED", "diverged": "FAILED"}
BATCH = 100  # MLflow takes at most 100 params (1000 metrics) per call


def metric_key(name: str) -> str:
    """MLflow allows letters, digits, ``_ - . / : space`` in names: ``per_env/p=0.1`` is
    written ``per_env/p:0.1``."""
    return re.sub(r"[^\w./\- :]", "_", name.replace("=", ":"))


def locations(uri: str, base: Path) -> tuple[str, str | None]:
    """The tracking URI (given, else $MLFLOW_TRACKING_URI, else SQLite beside the store)
    and, for a local SQLite store, its artifact folder beside it (else the server's)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        uri = f"sqlite:///{(base / 'mlflow.db').resolve()}"
    if uri.startswith("sqlite:///"):
        return uri, (Path(uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
    return uri, None


class MlflowSink(Sink):
    name = "MLflow"

    def __init__(self, opts, base: Path, run_id: str | None, name: str, config: dict) -> None:
        from mlflow.tracking import MlflowClient

        for noisy in ("mlflow.store.db.utils", "alembic.runtime.migration"):
            logging.getLogger(noisy).setLevel(logging.WARNING)  # table set-up chatter
        uri, artifacts = locations(opts.mlflow_uri, base)
        try:
            self.client = MlflowClient(uri)
            experiment = self._experiment(opts.mlflow_experiment, artifacts)
            found = []
            if run_id is not None:
                query = f"tags.`fedshift.run_id` = '{run_id}'"
                found = self.client.search_runs([experiment], query, max_results=1)
            if found:
                self.run_id = found[0].info.run_id
                self._resume(found[0], config)
            else:
                tags = {"fedshift.run_id": run_id or "", "fedshift.store": str(base)}
                run = self.client.create_run(experiment, run_name=name, tags=tags)
                self.run_id = run.info.run_id
                self._params({k: v for k, v in config.items()})
        except Exception as e:
            if isinstance(e, FedshiftError):
                raise
            raise FedshiftError(f"cannot log to MLflow at {uri!r}: {e}") from None

    def _experiment(self, name: str, artifacts: str | None) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifacts)
        except Exception:  # created meanwhile by another process
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _params(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [
            Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in config.items()
        ]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + BATCH])

    def _resume(self, run, config: dict[str, Any]) -> None:
        """Continue the MLflow run: from its last logged round on, with keys the resume
        changed as ``config.<key>`` tags (MLflow params cannot change)."""
        history = self.client.get_metric_history(self.run_id, "loss")
        self.last = max((m.step for m in history), default=0)
        kept = run.data.params
        self._params({k: v for k, v in config.items() if k not in kept})
        for k, v in config.items():
            text = json.dumps(v) if not isinstance(v, str) else v
            if k in kept and kept[k] != text:
                self.client.set_tag(self.run_id, f"config.{k}", f"{text} (from round {self.last})")
        self.client.update_run(self.run_id, status="RUNNING")

    def _metrics(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_key(k), v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])

    def write_round(self, step: int, scalars: dict[str, float]) -> None:
        self._metrics(step, scalars)

    def finish(self, metrics: dict[str, Any]) -> None:
        self._metrics(self.last, final_scalars(metrics))
        self.client.log_text(self.run_id, final_table(metrics), "final_accuracy.md")
        self.client.log_dict(self.run_id, metrics, "final_metrics.json")
        self.client.set_terminated(self.run_id, "FINISHED")

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, STATUS.get(status, "FAILED"))
