"""The Python API a notebook user drives in a few lines::

    import fedshift as fs
    data = fs.scenario("dirichlet", alpha=0.1, clients=20, data_dir="../shared/datasets")
    out = fs.run(algorithm="fedprox", data=data, rounds=20, algorithm_options={"mu": 0.01})
    out.metrics["worst"], out.metrics["per_env"]
    out.frame()  # a DataFrame: one row per client × environment

``fs.run`` takes the same keys as the CLI (``rounds``, ``lr``, ``"scenario.alpha"`` …) and
records the run in the run store when ``db`` is given.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RunConfig, apply
from .data import FederatedData, build_scenario
from .engine.checkpoint import check_binding, config_hash, load_checkpoint
from .engine.runner import RoundRecord, RunResult, RunStopped
from .errors import FedshiftError
from .eval.metrics import over_seeds
from .experiment import build_experiment, environment_info
from .results.store import RunStore, check_run_id


@dataclass
class RunOutcome:
    run_id: str | None
    config: RunConfig
    result: RunResult

    @property
    def metrics(self) -> dict:
        return self.result.metrics

    def summary(self) -> dict[str, Any]:
        """The JSON summary of ``fedshift run --json`` (a stable contract)."""
        val = self.result.rounds[-1].val if self.result.rounds else None
        return {
            "run_id": self.run_id,
            "algorithm": self.config.algorithm,
            "scenario": self.config.scenario,
            "rounds": self.config.rounds,
            "seed": self.config.seed,
            "metrics": self.result.metrics,
            "val": val,
            "time_s": round(self.result.time_s, 3),
            "bytes_up": self.result.bytes_up,
            "bytes_down": self.result.bytes_down,
            "events": count_events(self.result.rounds),
        }

    def frame(self):
        """Per-client × per-environment test accuracies (%) as a DataFrame with the columns
        ``client, env, accuracy`` (what ``fs.load_client_metrics`` gives for a stored run)."""
        import pandas as pd

        acc = self.result.accuracy
        rows = [
            {"client": c, "env": env, "accuracy": float(acc[c, j])}
            for c in range(acc.shape[0])
            for j, env in enumerate(self.result.env_names)
        ]
        return pd.DataFrame(rows, columns=["client", "env", "accuracy"])


def count_events(rounds: list[RoundRecord]) -> dict[str, int]:
    """How many client faults of each kind the run met (dropped, delayed, nonfinite …)."""
    counts: dict[str, int] = {}
    for rec in rounds:
        for e in rec.extras.get("events", []):
            counts[e["event"]] = counts.get(e["event"], 0) + 1
    return counts


def seeds_summary(outcomes: list[RunOutcome]) -> dict[str, Any]:
    """One summary for the same config run with several seeds: ``metrics`` holds the mean
    over seeds of each number, ``metrics_std`` the standard deviation; costs are totals."""
    summaries = [o.summary() for o in outcomes]
    mean, std = over_seeds([s["metrics"] for s in summaries])
    first = summaries[0]
    return {
        "run_id": first["run_id"],
        "run_ids": [s["run_id"] for s in summaries],
        "algorithm": first["algorithm"],
        "scenario": first["scenario"],
        "rounds": first["rounds"],
        "seed": first["seed"],
        "seeds": [s["seed"] for s in summaries],
        "metrics": mean,
        "metrics_std": std,
        "time_s": round(sum(s["time_s"] for s in summaries), 3),
        "bytes_up": sum(s["bytes_up"] for s in summaries),
        "bytes_down": sum(s["bytes_down"] for s in summaries),
    }


def scenario(
    name: str, seed: int = 0, data_dir: str | Path | None = None, **options
) -> FederatedData:
    """Build a registered scenario (options as keyword arguments)."""
    return build_scenario(name, options, seed, data_dir)


def make_config(config: RunConfig | None = None, **settings) -> RunConfig:
    cfg = config or RunConfig()
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if key.endswith("_options") and isinstance(value, dict):
            section = key[: -len("_options")]
            flat.update({f"{section}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return apply(cfg, flat).validate()


def checkpoint_path(db: str | Path, run_id: str) -> Path:
    """Where a run's checkpoint lives: ``checkpoints/<run_id>.pt`` beside the run store
    (the id is checked first, so no id can point outside that folder)."""
    return Path(db).parent / "checkpoints" / f"{check_run_id(run_id)}.pt"


@contextlib.contextmanager
def stop_on_signals(runner):
    """SIGINT / SIGTERM ask the runner to finish its round, checkpoint and stop; a second
    SIGINT interrupts at once. Only the main thread can install handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def request_stop(signum, frame):
        if runner.stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        runner.stop_requested = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(
    config: RunConfig | None = None,
    *,
    data: FederatedData | None = None,
    db: str | Path | None = None,
    on_round=None,
    **settings,
) -> RunOutcome:
    """Run one configuration to the end; with ``db`` the run is recorded in the run store
    and checkpointed beside it (``checkpoint_every`` rounds), so it can be resumed.

    If the run fails or is interrupted, the store keeps its status, error and the rounds
    it completed, and the exception propagates.
    """
    cfg = make_config(config, **settings)
    if data is not None and "scenario" not in settings:
        cfg.scenario = data.name
    store = RunStore(db) if db is not None else None
    holder: dict[str, str] = {}
    exp = build_experiment(cfg, data=data, on_round=_recorder(store, holder, on_round))
    if store is not None:
        env = environment_info(exp.ctx.device)
        if "oracle_accuracy" in exp.data.info:  # an analytic oracle reports can draw
            env["oracle_accuracy"] = float(exp.data.info["oracle_accuracy"])
        holder["run_id"] = store.start(cfg.flat(), env)
    digest = config_hash(cfg.flat()) if store is not None else ""
    return _execute(exp, store, holder.get("run_id"), None, digest)


def resume(
    run_id: str,
    db: str | Path,
    *,
    data: FederatedData | None = None,
    on_round=None,
    data_dir: str | None = None,
) -> RunOutcome:
    """Continue an interrupted or failed run from its last checkpoint, with its recorded
    config; the finished run has the same metrics as an uninterrupted one. A run marked
    done without final metrics (killed, by an older version, after its last checkpoint)
    is repaired the same way."""
    check_run_id(run_id, prefix=True)  # before the store: a hostile id never gets that far
    store = RunStore(db)
    record = store.run(run_id)  # a unique prefix names the run too
    run_id = check_run_id(record["run_id"])
    if record["status"] == "done" and record["metrics"]:
        raise FedshiftError(f"run {run_id!r} already finished; nothing to resume")
    cfg = apply(RunConfig(), dict(record["config"])).validate()
    if data_dir is not None:  # the data may have moved since the run started
        cfg.data_dir = data_dir
    exp = build_experiment(cfg, data=data, on_round=_recorder(store, {"run_id": run_id}, on_round))
    digest = config_hash(record["config"])
    path = checkpoint_path(store.path, run_id)
    result = None
    if path.exists():
        state = load_checkpoint(path)
        check_binding(state, path, run_id, digest, cfg.rounds)
        result = exp.runner.load_state_dict(state)
    store.restart(run_id)
    return _execute(exp, store, run_id, result, digest)


def _recorder(store: RunStore | None, holder: dict, on_round):
    def record(rec: RoundRecord) -> None:
        if store is not None:
            store.log_round(holder["run_id"], rec)
        if on_round is not None:
            on_round(rec)

    return record


def _execute(exp, store: RunStore | None, run_id: str | None, result, digest: str) -> RunOutcome:
    runner = exp.runner
    if store is not None:
        runner.checkpoint_path = checkpoint_path(store.path, run_id)
        runner.checkpoint_every = exp.config.checkpoint_every
        runner.checkpoint_meta = {"run_id": run_id, "config_hash": digest}
    try:
        with stop_on_signals(runner):
            result = runner.run(result)
    except RunStopped as e:
        if store is not None:
            how = f"resume with: fedshift run --resume {run_id} --db {store.path}"
            store.fail(run_id, "interrupted", f"stopped after round {e.rounds_done}; {how}")
            e.hint = how
        raise
    except KeyboardInterrupt:
        if store is not None:
            store.fail(run_id, "interrupted", "interrupted by the user")
        raise
    except BaseException as e:
        if store is not None:
            store.fail(run_id, "failed", "".join(traceback.format_exception_only(e)).strip())
        raise
    outcome = RunOutcome(run_id, exp.config, result)
    if store is not None:
        store.finish(run_id, result, outcome.summary()["val"])
    return outcome
