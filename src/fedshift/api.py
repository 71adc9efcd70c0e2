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
import os
import signal
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RunConfig, apply
from .data import FederatedData, build_scenario
from .engine.checkpoint import check_binding, config_hash, load_checkpoint
from .engine.runner import RoundRecord, RunResult
from .errors import Diverged, FedshiftError, RunStopped
from .experiment import build_experiment, environment_info
from .plugins import import_modules, imported_already, user_modules
from .results.store import DEFAULT_DB, RunStore, _now, check_run_id, checkpoint_path


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


def scenario(
    name: str, seed: int = 0, data_dir: str | Path | None = None, **options
) -> FederatedData:
    """Build a registered scenario (options as keyword arguments)."""
    return build_scenario(name, options, seed, data_dir)


def make_config(config: RunConfig | None = None, **settings) -> RunConfig:
    """A validated config from keyword settings (``algorithm_options={...}`` or dotted
    ``"algorithm.mu"`` keys); its ``imports`` are imported."""
    cfg = config or RunConfig()
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if key.endswith("_options") and isinstance(value, dict):
            section = key[: -len("_options")]
            flat.update({f"{section}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    cfg = apply(cfg, flat)
    cfg.imports = import_modules(cfg.imports)
    return cfg.validate()


def record_recipe(cfg: RunConfig, data: FederatedData, name_from_data: bool) -> None:
    """Make the config of a run on ``data`` (given from Python) name how that data was
    built, so ``fedshift run --resume`` rebuilds it: the registered scenario, its options
    (those set in the config win) and data folder. Data assembled in Python keep their
    name; the fingerprint (:func:`data_identity`) guards their resume."""
    recipe = data.recipe
    if name_from_data:
        cfg.scenario = recipe["scenario"] if recipe else data.name
    if recipe and recipe["scenario"] == cfg.scenario:
        for key, value in recipe["options"].items():
            cfg.scenario_options.setdefault(key, value)
        if recipe["data_dir"] and not cfg.data_dir:
            cfg.data_dir = recipe["data_dir"]


def record_user_modules(cfg: RunConfig, data: FederatedData) -> None:
    """Add to ``cfg.imports`` the user's modules that define the run's algorithm, scenario
    or model (registered from Python without ``imports``), so a resume from the command
    line can import them again."""
    model = data.default_model if cfg.model == "auto" else cfg.model
    used = {"algorithm": cfg.algorithm, "scenario": cfg.scenario, "model": model}
    cfg.imports = [*cfg.imports, *user_modules(used)]


def data_identity(data: FederatedData) -> dict[str, Any]:
    """What the run store keeps about a run's data (``environment["data"]``): its
    fingerprint, whether it came from a registered scenario, and that scenario's seed."""
    recipe = data.recipe
    return {
        "fingerprint": data.fingerprint(),
        "source": "scenario" if recipe else "python",
        "scenario_seed": recipe["seed"] if recipe else None,
    }


def check_same_data(record: dict, data: FederatedData, seed: int) -> None:
    """Refuse to resume a run on data other than what it trained on (its fingerprint);
    runs of older versions recorded none and are not checked."""
    kept = (record.get("environment") or {}).get("data") or {}
    if not kept.get("fingerprint"):
        return
    now = data.fingerprint()
    if now == kept["fingerprint"]:
        return
    if kept.get("source") == "python":
        why = "it trained on data assembled in Python, not a registered scenario"
    elif kept.get("scenario_seed") not in (None, seed):
        why = f"its scenario was built with seed {kept['scenario_seed']}, not the run seed {seed}"
    else:
        why = "the dataset files or the scenario's code changed since"
    raise FedshiftError(
        f"the data rebuilt to resume run {record['run_id']!r} differ from the data it trained "
        f"on (fingerprint {now[:12]}…, recorded {kept['fingerprint'][:12]}…): {why}; resume it "
        f"from Python with that data: fedshift.api.resume({record['run_id']!r}, db, data=…)"
    )


@contextlib.contextmanager
def training_lock(db: str | Path, run_id: str):
    """Hold the OS lock of a run (``checkpoints/<run_id>.lock``, beside its checkpoint)
    while this process trains it, so that two processes never train one run at once: a
    second one is refused in one sentence naming the process that holds it. The lock goes
    with the process (``flock``), so one left by a killed process never blocks; the small
    file stays. Without ``fcntl`` (Windows) no lock is taken."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = checkpoint_path(db, run_id).with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise FedshiftError(f"cannot create the lock file {str(path)!r}: {e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 20, 0).decode(errors="replace").strip() or "?"
            raise FedshiftError(
                f"run {run_id!r} is being trained by process {holder} right now; wait for it "
                f"to end, or stop it (kill -TERM {holder}) and then --resume"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


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
    progress: bool | None = None,
    group: str | None = None,
    **settings,
) -> RunOutcome:
    """Run one configuration to the end; with ``db`` the run is recorded in the run store
    and checkpointed beside it (``checkpoint_every`` rounds), so it can be resumed.
    ``group`` tags the runs one command starts together (``results.store.new_group``).

    ``progress``: a progress bar on stderr; None (the default) shows it only where someone
    watches (stderr is a terminal, or a notebook), False never. ``tracking=["tensorboard",
    "mlflow"]`` streams the run to those trackers too (``fedshift.tracking``).

    If the run fails or is interrupted, the store keeps its status, error and the rounds
    it completed, and the exception propagates.
    """
    cfg = make_config(config, **settings)
    if data is not None:
        record_recipe(cfg, data, "scenario" not in settings)
    store = RunStore(db) if db is not None else None
    holder: dict[str, Any] = {}
    bar, on_round = _with_bar(progress, cfg.rounds, f"{cfg.algorithm} on {cfg.scenario}", on_round)
    try:
        exp = build_experiment(cfg, data=data, on_round=_recorder(store, holder, on_round))
        record_user_modules(cfg, exp.data)
        if store is not None:
            env = environment_info(exp.ctx.device)
            if "oracle_accuracy" in exp.data.info:  # an analytic oracle reports can draw
                env["oracle_accuracy"] = float(exp.data.info["oracle_accuracy"])
            env["data"] = data_identity(exp.data)
            holder["run_id"] = store.start(cfg.flat(), env, group)
        base = store.path.parent if store is not None else DEFAULT_DB.parent
        holder["tracking"] = _open_tracking(store, holder.get("run_id"), cfg.flat(), base, [])
        digest = config_hash(cfg.flat()) if store is not None else ""
        if store is None:
            return _execute(exp, None, None, None, digest, holder["tracking"])
        with training_lock(store.path, holder["run_id"]):
            return _execute(exp, store, holder["run_id"], None, digest, holder["tracking"])
    finally:
        if bar is not None:
            bar.stop()


def _with_bar(progress: bool | None, total: int, label: str, on_round):
    """A progress bar when ``progress`` wants one (:func:`fedshift.progress.wanted`), and
    ``on_round`` extended to advance it."""
    from .progress import progress_bar, wanted

    if not wanted(progress):
        return None, on_round
    bar, tick = progress_bar(total, label)

    def both(rec: RoundRecord) -> None:
        tick(rec)
        if on_round is not None:
            on_round(rec)

    return bar, both


def _open_tracking(store, run_id, config: dict, base: Path, stored: list[dict]):
    """The run's trackers (None when ``tracking`` is off); if they cannot be opened, a
    recorded run is marked failed with the reason before the error propagates."""
    from .tracking import open_tracking

    try:
        return open_tracking(config, run_id, base, stored)
    except BaseException as e:
        if store is not None and run_id is not None:
            store.fail(run_id, "failed", "".join(traceback.format_exception_only(e)).strip())
        raise


# keys ``resume(..., overrides=...)`` may change: how training goes on, never which data
# or model it trains; plus ``faults.max_norm`` and ``algorithm.<option>`` for the method's
# float options (step sizes, penalty weights). See docs/reliability.md.
RESUME_KEYS = (
    "threads",
    "lr",
    "momentum",
    "weight_decay",
    "rounds",
    "eval_every",
    "checkpoint_every",
    "cohort_size",
    "device",
    "tracking",
)


def resume_changes(record: dict, overrides: dict[str, Any]) -> tuple[dict, dict]:
    """The run's config with ``overrides`` applied and the keys that really change
    (``{key: {"from": old, "to": new}}``); refuses, before anything is modified, a key
    that would change the experiment's data, model or method, and a round count below
    the rounds already done."""
    from .algorithms import ALGORITHMS
    from .config import ALIASES
    from .options import _convert, describe_options

    old = dict(record["config"])
    before = apply(RunConfig(), dict(old)).validate()
    floats = {"faults.max_norm": 0.0}  # key → its default
    floats |= {
        f"algorithm.{o['name']}": o["default"]
        for o in describe_options(ALGORITHMS.get(before.algorithm).Hyper)
        if o["type"] == "float"
    }
    normalized = {ALIASES.get(k, k): v for k, v in overrides.items()}
    for key in normalized:
        if key not in RESUME_KEYS and key not in floats:
            allowed = ", ".join([*RESUME_KEYS, *floats])
            raise FedshiftError(
                f"--resume cannot change {key!r}: it would change the experiment's data, model "
                f"or method; start a new run for that (keys a resume can change: {allowed})"
            )
    after = apply(RunConfig(), {**old, **normalized}).validate()
    new, changes = dict(old), {}
    for key, raw in normalized.items():
        if key in floats:
            value = _convert(key, float, raw)
            was = _convert(key, float, old[key]) if key in old else floats[key]
        else:
            value, was = after.flat()[key], before.flat()[key]
        if value != was:
            new[key] = value
            changes[key] = {"from": was, "to": value}
    if after.rounds < record["rounds_done"]:
        raise FedshiftError(
            f"rounds={after.rounds} is fewer than the {record['rounds_done']} rounds run "
            f"{record['run_id']!r} has done; give rounds >= {record['rounds_done']}"
        )
    return new, changes


def resume(
    run_id: str,
    db: str | Path,
    *,
    data: FederatedData | None = None,
    on_round=None,
    data_dir: str | None = None,
    overrides: dict[str, Any] | None = None,
    progress: bool | None = None,
) -> RunOutcome:
    """Continue an interrupted, failed or diverged run from its last checkpoint, with its
    recorded config; the finished run has the same metrics as an uninterrupted one. A run
    marked done without final metrics (killed, by an older version, after its last
    checkpoint) is repaired the same way.

    ``overrides`` (dotted keys as for :func:`run`) change how training goes on from the
    checkpoint: ``lr``, ``rounds`` (to extend a run, even a finished one) and the other
    ``RESUME_KEYS``, and the method's float options (``algorithm.server_lr`` …). The run's
    config in the store becomes the new one, and its ``overrides`` record which keys
    changed from what to what at which round; keys that would change the data, model or
    method are refused. ``progress`` as for :func:`run`."""
    check_run_id(run_id, prefix=True)  # before the store: a hostile id never gets that far
    store = RunStore(db)
    run_id = check_run_id(store.run(run_id)["run_id"])  # a unique prefix names the run too
    with training_lock(store.path, run_id):
        record = store.run(run_id)
        rounds = str((overrides or {}).get("rounds", record["rounds"]))
        total = int(rounds) if rounds.isdigit() else record["rounds"]  # the bar's end
        bar, on_round = _with_bar(progress, total, f"resuming {run_id}", on_round)
        try:
            return _resume(store, run_id, data, on_round, data_dir, overrides)
        finally:
            if bar is not None:
                bar.stop()


def _resume(store: RunStore, run_id: str, data, on_round, data_dir, overrides) -> RunOutcome:
    record = store.run(run_id)
    reimport(record)
    config, changes = resume_changes(record, overrides or {})
    extends = "rounds" in changes and changes["rounds"]["to"] > changes["rounds"]["from"]
    finished = record["status"] == "done" and record["metrics"]
    if finished and not extends:
        raise FedshiftError(
            f"run {run_id!r} already finished; nothing to resume (give --set rounds=N with "
            f"N > {record['rounds']} to extend it)"
        )
    holder: dict[str, Any] = {"run_id": run_id}
    cfg, exp = rebuild(record, config, data, data_dir, _recorder(store, holder, on_round))
    digest = config_hash(record["config"])
    path = checkpoint_path(store.path, run_id)
    result = None
    done = 0
    if path.exists():
        state = load_checkpoint(path)
        done = state["rounds_done"] if type(state["rounds_done"]) is int else -1
        # hashes of the configs before changes that took effect at this checkpoint's round
        earlier = []
        for entry in reversed(record["overrides"]):
            if entry.get("round") != done:
                break
            earlier.append(entry.get("from_hash"))
        check_binding(state, path, run_id, digest, cfg.rounds, tuple(earlier))
        result = exp.runner.load_state_dict(state)
    elif finished:
        raise FedshiftError(
            f"run {run_id!r} is finished but its checkpoint {str(path)!r} is gone; it cannot "
            "be extended (start a new run with more rounds)"
        )
    env = environment_info(exp.ctx.device)  # a resume may run on another kind of machine
    store.note_resume(
        run_id,
        {"round": done, "device": env["device"], "cpu": env["cpu"], "time": _now()},
    )
    if changes:
        entry = {"round": done, "changes": changes, "from_hash": digest}
        store.override(run_id, config, {**entry, "time": _now()})
        digest = config_hash(config)
    store.restart(run_id)
    stored = store.run(run_id)  # the trackers catch up with every round stored so far
    holder["tracking"] = _open_tracking(
        store, run_id, stored["config"], store.path.parent, stored["round_metrics"]
    )
    return _execute(exp, store, run_id, result, digest, holder["tracking"])


def rebuild(record: dict, config: dict, data=None, data_dir=None, on_round=None):
    """A stored run's experiment again (``config``: its recorded config, or that with a
    resume's overrides): the config validated, the data root moved if given, the data
    checked to be the partition the run trained on. Returns (config, experiment)."""
    cfg = apply(RunConfig(), dict(config)).validate()
    if data_dir is not None:  # the data may have moved since the run started
        cfg.data_dir = data_dir
    exp = build_experiment(cfg, data=data, on_round=on_round)
    check_same_data(record, exp.data, cfg.seed)
    return cfg, exp


def reimport(record: dict) -> None:
    """Import the modules a run recorded in its config (``imports``) before its names are
    looked up; one sentence when one of them cannot be imported here."""
    specs = record["config"].get("imports") or []
    try:
        import_modules([s for s in specs if not imported_already(s)])
    except FedshiftError as e:
        raise FedshiftError(
            f"run {record['run_id']!r} needs the modules it was started with "
            f"({', '.join(specs)}): {e}; resume it from the folder it was started in, or "
            "give the module's file with --import"
        ) from None


def _recorder(store: RunStore | None, holder: dict, on_round):
    """The runner's ``on_round``: the round goes to the store, then to the trackers
    (``holder["tracking"]``), then to the caller's ``on_round``."""

    def record(rec: RoundRecord) -> None:
        if store is not None:
            store.log_round(holder["run_id"], rec)
        if holder.get("tracking") is not None:
            holder["tracking"].log_round(vars(rec))
        if on_round is not None:
            on_round(rec)

    return record


def _execute(
    exp, store: RunStore | None, run_id: str | None, result, digest: str, tracking=None
) -> RunOutcome:
    runner = exp.runner
    if store is not None:
        runner.checkpoint_path = checkpoint_path(store.path, run_id)
        runner.checkpoint_every = exp.config.checkpoint_every
        runner.checkpoint_meta = {"run_id": run_id, "config_hash": digest}
    try:
        result = _train(runner, store, run_id, result)
    except BaseException as e:
        if tracking is not None:
            stopped = isinstance(e, (RunStopped, KeyboardInterrupt))
            tracking.close(
                "interrupted" if stopped else "diverged" if isinstance(e, Diverged) else "failed"
            )
        raise
    outcome = RunOutcome(run_id, exp.config, result)
    if store is not None:
        store.finish(run_id, result, outcome.summary()["val"])
    if tracking is not None:
        tracking.finish(result.metrics)
    return outcome


def _train(runner, store: RunStore | None, run_id: str | None, result) -> RunResult:
    """``runner.run`` with the store told how a run that does not finish ended."""
    try:
        with stop_on_signals(runner):
            return runner.run(result)
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
    except Diverged as e:
        e.run_id = run_id
        if store is not None:
            store.fail(run_id, "diverged", str(e))
            e.hint = (
                f"its rounds are kept; to go on from its last checkpoint with a fixed setting: "
                f"fedshift run --resume {run_id} --db {store.path} --set KEY=VALUE"
            )
        raise
    except BaseException as e:
        if store is not None:
            store.fail(run_id, "failed", "".join(traceback.format_exception_only(e)).strip())
        raise
