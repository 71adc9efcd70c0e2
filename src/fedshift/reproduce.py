"""`fedshift reproduce TABLE_ID`: re-run one of the papers' tables and put our numbers
beside the published ones.

A table is data, one TOML file per paper table in ``configs/`` (shipped inside the package
as ``fedshift/configs``)::

    [table]
    id = "thesis-5.1-cmnist8"          # the file name without .toml
    title = "..."                        # one line
    source = "thesis Table 5.1"
    metrics = ["worst", "average"]      # the published metrics (worst, average,
                                         # worst_client; "accuracy" = average)
    seeds = 3                            # default K (--seeds overrides)
    gap = 5.0                            # published gaps ≥ this are checked as claims
    scenario_seed = 0                    # optional: one partition for every seed

    [run]                                # RunConfig keys shared by every method
    rounds = 600
    [run.scenario]                       # the scenario and its options
    name = "cmnist"
    clients = 8

    [quick]                              # overrides for --quick (a smoke-sized run)
    rounds = 3

    [sweep]                              # optional: one run per value, e.g. PACS's held-out
    key = "scenario.held_out"            # domains; the runs' average accuracies become the
    values = ["art_painting", "sketch"]  # table's environments (worst / average over them)

    [[method]]
    name = "FedProx"                     # the paper's row label
    algorithm = "fedprox"                # registry name
    options = { mu = 0.01 }             # algorithm options
    set = { lr = 0.05 }                 # optional per-method RunConfig overrides
    published = { worst = 3.4, average = 51.0 }
    tuned = { "algorithm.mu" = "fedshift sweep --grid algorithm.mu=0.001,0.01,0.1 …: val …" }
    # ours = true: a variant of ours, not in the paper (no published numbers; say why in notes)

``tuned`` (in ``[[method]]``, or in ``[table]`` for the shared ``[run]`` keys) records, for
each setting the paper does not give, how it was chosen: the ``fedshift sweep`` command on
validation data and what it found. Every tuned key must be a key the table sets (checked
on load); the report lists them under "Settings the paper does not give".

Every method runs on the same partitions: for seed k all methods use the scenario built
with seed k (or ``scenario_seed`` when set), built once and shared. Each run is recorded
in the run store; the report (Markdown, with plots) gives our mean ± std over seeds beside
the published number, the rank correlation of the two orderings (Spearman and Kendall,
SciPy) and, for every pair of methods whose published numbers differ by at least ``gap``
points, whether our numbers keep that order.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .config import (  # tomllib: tomli on Python 3.10
    RunConfig,
    _flatten,
    apply,
    parse_toml,
    table_names,
    table_text,
    tomllib,
)
from .errors import FedshiftError, did_you_mean
from .eval.metrics import mean_std
from .results.store import DEFAULT_DB

METRICS = ("worst", "average", "worst_client", "average_pooled")
# "accuracy" = the client-averaged mean; "accuracy_pooled" = Σ correct / Σ samples (the pFedMe
# code's, which the thesis's Table 3.1 builds on)
ALIASES = {"accuracy": "average", "accuracy_pooled": "average_pooled"}


@dataclass
class Method:
    name: str
    algorithm: str
    options: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    published: dict[str, float] = field(default_factory=dict)
    ours: bool = False  # a variant of ours shown beside the paper's rows (no published number)
    tuned: dict[str, str] = field(default_factory=dict)  # setting → how it was chosen


@dataclass
class Table:
    id: str
    title: str
    source: str
    metrics: list[str]
    run: dict[str, Any]
    methods: list[Method]
    seeds: int = 1
    gap: float = 5.0
    scenario_seed: int | None = None
    quick: dict[str, Any] = field(default_factory=dict)
    sweep_key: str | None = None
    sweep_values: list[Any] = field(default_factory=list)
    notes: str = ""
    tuned: dict[str, str] = field(default_factory=dict)  # shared [run] setting → how chosen


# ---------------------------------------------------------------- loading


def load_table(source: str) -> Table:
    """A table by id (``fedshift/configs/<id>.toml``) or from a TOML file path."""
    path = Path(source)
    if path.suffix == ".toml":
        if not path.is_file():
            raise FedshiftError(f"table file {source!r} does not exist")
        text, default_id = path.read_text(), path.stem
    elif source in table_names():
        text, default_id = table_text(source), source
    else:
        from .config import preset_names

        if source in preset_names():
            raise FedshiftError(
                f"{source!r} is a run preset, not a paper table: run it with fedshift run {source}"
            )
        raise FedshiftError(
            f"unknown table {source!r}{did_you_mean(source, table_names())}; choose one of: "
            f"{', '.join(table_names())} "
            "(or give a .toml file)"
        )
    raw = parse_toml(text, f"table {source!r}")
    return parse_table(raw, default_id)


def parse_table(raw: dict, default_id: str = "table") -> Table:
    head = raw.get("table", {})
    metrics = [ALIASES.get(m, m) for m in head.get("metrics", ["worst", "average"])]
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        raise FedshiftError(
            f"table metrics {bad} are not known; use worst, average, worst_client, accuracy "
            "or accuracy_pooled"
        )
    methods = []
    for i, m in enumerate(raw.get("method", [])):
        if "name" not in m or "algorithm" not in m:
            raise FedshiftError(f"method {i + 1} of the table needs a name and an algorithm")
        published = {ALIASES.get(k, k): float(v) for k, v in m.get("published", {}).items()}
        method = Method(
            str(m["name"]),
            str(m["algorithm"]),
            dict(m.get("options", {})),
            _flatten(dict(m.get("set", {}))),
            published,
            bool(m.get("ours", False)),
            {str(k): str(v) for k, v in m.get("tuned", {}).items()},
        )
        own = {f"algorithm.{k}" for k in method.options} | set(method.settings)
        unknown = sorted(set(method.tuned) - own)
        if unknown:
            raise FedshiftError(
                f"method {method.name!r} records how {unknown[0]!r} was tuned but does not set "
                "it; tuned keys must be the method's options (algorithm.NAME) or set keys"
            )
        methods.append(method)
    if not methods:
        raise FedshiftError("the table lists no [[method]] entries")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise FedshiftError(f"method names must be distinct in a table, got {names}")
    sweep = raw.get("sweep", {})
    run = _flatten(dict(raw.get("run", {})))
    tuned = {str(k): str(v) for k, v in head.get("tuned", {}).items()}
    unknown = sorted(set(tuned) - set(run))
    if unknown:
        raise FedshiftError(
            f"the table records how {unknown[0]!r} was tuned but its [run] does not set it"
        )
    return Table(
        id=str(head.get("id", default_id)),
        title=str(head.get("title", default_id)),
        source=str(head.get("source", "")),
        metrics=metrics,
        run=run,
        methods=methods,
        seeds=int(head.get("seeds", 1)),
        gap=float(head.get("gap", 5.0)),
        scenario_seed=head.get("scenario_seed"),
        quick=_flatten(dict(raw.get("quick", {}))),
        sweep_key=sweep.get("key"),
        sweep_values=list(sweep.get("values", [])),
        notes=str(head.get("notes", "")),
        tuned=tuned,
    )


# ---------------------------------------------------------------- running


def listed_methods(table: Table) -> str:
    """The table's methods as one list for a sentence: ``'FedAvg' (fedavg), …``."""
    return ", ".join(f"{m.name!r} ({m.algorithm})" for m in table.methods)


def select_methods(table: Table, names: list[str] | None) -> Table:
    """The table restricted to the methods named (by method name or algorithm name), in the
    table's order; one clear sentence for a name the table does not have."""
    if not names:
        return table
    known = {m.name for m in table.methods} | {m.algorithm for m in table.methods}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise FedshiftError(
            f"table {table.id} has no method {unknown[0]!r}; its methods are: "
            f"{listed_methods(table)}"
        )
    chosen = [m for m in table.methods if m.name in names or m.algorithm in names]
    return replace(table, methods=chosen)


def algorithm_option_names(algorithm: str) -> set[str]:
    from .algorithms import ALGORITHMS

    if algorithm not in ALGORITHMS:
        return set()
    return {f.name for f in fields(ALGORITHMS.get(algorithm).Hyper)}


def missing_algorithms(table: Table) -> list[str]:
    from .algorithms import ALGORITHMS

    return sorted({m.algorithm for m in table.methods if m.algorithm not in ALGORITHMS})


def method_config(table: Table, method: Method, overrides: dict[str, Any]) -> RunConfig:
    """The method's validated RunConfig (table run keys, method settings, overrides)."""
    from .algorithms import ALGORITHMS
    from .options import build_options

    cfg = RunConfig()
    apply(cfg, dict(table.run))
    apply(cfg, {"algorithm": method.algorithm})
    apply(cfg, {f"algorithm.{k}": v for k, v in method.options.items()})
    apply(cfg, dict(method.settings))
    # an override of an algorithm option reaches the methods whose algorithm has it
    own = algorithm_option_names(method.algorithm)
    apply(
        cfg,
        {
            k: v
            for k, v in overrides.items()
            if not k.startswith("algorithm.") or k.removeprefix("algorithm.") in own
        },
    )
    cfg.validate()
    # check the algorithm's options now, before anything runs
    build_options(ALGORITHMS.get(cfg.algorithm).Hyper, cfg.algorithm_options, "algorithm")
    return cfg


def check_option_overrides(table: Table, methods: list[Method], overrides: dict) -> None:
    """An ``algorithm.<option>`` override must be an option of at least one of ``methods``'
    algorithms (:func:`method_config` gives it only to those): one sentence otherwise."""
    for key in overrides:
        name = key.removeprefix("algorithm.")
        if key.startswith("algorithm.") and not any(
            name in algorithm_option_names(m.algorithm) for m in methods
        ):
            if len(methods) == 1:
                m = methods[0]
                raise FedshiftError(
                    f"--set {key}: method {m.name!r} of table {table.id} runs {m.algorithm}, "
                    f"which has no option {name!r}"
                )
            raise FedshiftError(
                f"--set {key}: no method of table {table.id} has the algorithm option "
                f"{name!r} (an algorithm option reaches only the methods whose algorithm has it)"
            )


def scenario_seed(table: Table, cfg: RunConfig) -> int:
    """The seed a method's scenario is built with: the run's, or the table's
    ``scenario_seed`` (one partition for every seed)."""
    return cfg.seed if table.scenario_seed is None else int(table.scenario_seed)


# ---------------------------------------------------------------- one row


def is_table_source(source: str | None) -> bool:
    """Whether ``source`` names a paper table rather than a run config: a shipped table id
    (``fedshift list presets`` marks them), or a TOML file with ``[table]`` or
    ``[[method]]`` (keys no run config has)."""
    if not source:
        return False
    path = Path(source)
    if path.exists():  # a file path wins over a name, as in config.load_source
        if path.suffix != ".toml" or not path.is_file():
            return False
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
            return False  # load_source says what is wrong with it
        return "table" in raw or "method" in raw
    return source in table_names()


def find_method(table: Table, name: str) -> Method:
    """The table's method called ``name`` (case-insensitive), else the one method whose
    algorithm is ``name``; one sentence when there is none, or when several rows run that
    algorithm (their names then tell them apart)."""
    key = name.strip().casefold()
    named = [m for m in table.methods if m.name.casefold() == key]
    exact = [m for m in named if m.name == name.strip()]
    if len(named) == 1 or exact:
        return (exact or named)[0]
    if len(named) > 1:
        raise FedshiftError(
            f"table {table.id} has methods {', '.join(repr(m.name) for m in named)}; give "
            "--method with the name as written"
        )
    runs = [m for m in table.methods if m.algorithm.casefold() == key]
    if len(runs) == 1:
        return runs[0]
    if runs:
        raise FedshiftError(
            f"table {table.id} runs {runs[0].algorithm} in {len(runs)} rows, "
            f"{', '.join(repr(m.name) for m in runs)}; give --method the row's name"
        )
    hint = did_you_mean(key, [m.name.casefold() for m in table.methods])  # any case works
    raise FedshiftError(
        f"table {table.id} has no method {name!r}{hint}; its methods are: {listed_methods(table)}"
    )


class ScenarioCache:
    """A table's scenarios, built once per (scenario, options, seed): every method of a
    seed trains on the same partition."""

    def __init__(self, table: Table) -> None:
        self.table, self.built = table, {}

    def __call__(self, cfg: RunConfig):
        from .data import build_scenario

        seed = scenario_seed(self.table, cfg)
        key = (cfg.scenario, repr(sorted(cfg.scenario_options.items())), seed)
        if key not in self.built:
            self.built[key] = build_scenario(
                cfg.scenario, cfg.scenario_options, seed, cfg.data_dir or None
            )
        return self.built[key]


@dataclass
class Row:
    """One method of a table run on its own (``fedshift run TABLE --method NAME``), with
    the settings :func:`run_table` gives it: the table's ``[run]``, the method's algorithm,
    options and ``set``, then the command line's overrides."""

    table: Table
    method: Method
    _data: ScenarioCache = field(init=False, repr=False)  # a fixed partition, built once

    def __post_init__(self) -> None:
        self._data = ScenarioCache(self.table)

    def config(self, overrides: dict[str, Any]) -> RunConfig:
        """The row's validated config with ``overrides`` (``--set`` and options) on top."""
        from .algorithms import ALGORITHMS
        from .plugins import import_modules

        table, method = self.table, self.method
        import_modules(table.run.get("imports"))  # a table of the user's own methods
        if method.algorithm not in ALGORITHMS:
            raise FedshiftError(
                f"method {method.name!r} of table {table.id} runs algorithm "
                f"{method.algorithm!r}, which is not registered (its module: --import)"
            )
        if table.sweep_key and table.sweep_key not in overrides:
            values = ", ".join(map(str, table.sweep_values))
            raise FedshiftError(
                f"table {table.id} runs each method once per {table.sweep_key} ({values}) "
                f"and averages them; choose one with --set {table.sweep_key}=VALUE, or run "
                f"them all with fedshift reproduce {table.id} --methods {method.name!r}"
            )
        check_option_overrides(table, [method], overrides)
        cfg = method_config(table, method, overrides)
        cfg.imports = import_modules(cfg.imports)
        return cfg

    def data(self, cfg: RunConfig):
        """The data :func:`run_table` would give the run: None (the run builds its scenario
        from its seed) unless the table fixes ``scenario_seed``."""
        return None if self.table.scenario_seed is None else self._data(cfg)


def table_row(source: str | None, method: str | None) -> Row | None:
    """What ``fedshift run SOURCE [--method NAME]`` runs from a paper table: the row, or
    None when ``source`` is a run preset or config file (and no ``--method`` was given).
    One sentence for a table without ``--method`` (listing its methods), and for
    ``--method`` with anything but a table."""
    from .config import load_source, preset_names

    if not is_table_source(source):
        if method is None:
            return None
        if not source:
            raise FedshiftError(
                "--method picks a method (row) of a paper table: fedshift run TABLE --method "
                "NAME (fedshift list presets marks the paper tables)"
            )
        load_source(source)  # an unknown name or a bad file: that sentence first
        what = "a run preset" if source in preset_names() else "a run config file"
        raise FedshiftError(
            f"--method picks a method (row) of a paper table, and {source!r} is {what}, "
            "not a table; choose its algorithm with --set algorithm=NAME"
        )
    table = load_table(source)
    if method is None:
        raise FedshiftError(
            f"{source!r} is a paper table: run one of its methods with --method NAME, one of "
            f"{listed_methods(table)} (or all of them with fedshift reproduce {source})"
        )
    return Row(table, find_method(table, method))


@dataclass
class MethodResult:
    method: Method
    run_ids: list[str]
    per_seed: list[dict]  # metrics of each seed (sweep: combined over the sweep's runs)
    mean: dict[str, float | None]
    std: dict[str, float | None]
    per_env_mean: dict[str, float | None]

    @property
    def degenerate_seeds(self) -> int:
        return sum(bool(s.get("degenerate")) for s in self.per_seed)

    @property
    def degenerate(self) -> bool:
        """Any seed's model answered one class everywhere or never left chance loss."""
        return self.degenerate_seeds > 0

    def values(self, metric: str) -> list[float | None]:
        return [s.get(metric) for s in self.per_seed]


def diverged_metrics(why: str) -> dict:
    """The metrics of a seed whose run diverged: no numbers, counted as degenerate (so it
    enters no mean, rank correlation or held gap), with the reason shown in the report."""
    return {
        **dict.fromkeys(METRICS),
        "per_env": {},
        "per_client": [],
        "degenerate": True,
        "degenerate_why": why,
        "diverged": why,
    }


def _combine_sweep(metrics: list[dict], label: str, values: list) -> dict:
    """The runs of a sweep as one result: each run's average accuracy is an environment."""
    per_env = {f"{label}={v}": m["average"] for v, m in zip(values, metrics, strict=True)}
    ok = [v for v in per_env.values() if v is not None]
    clients = [m["worst_client"] for m in metrics if m["worst_client"] is not None]
    bad = [m for m in metrics if m.get("degenerate")]
    pooled = [m["average_pooled"] for m in metrics if m.get("average_pooled") is not None]
    return {
        "average_pooled": sum(pooled) / len(pooled) if pooled else None,
        "worst": min(ok) if ok else None,
        "average": sum(ok) / len(ok) if ok else None,
        "worst_client": min(clients) if clients else None,
        "per_env": per_env,
        "degenerate": bool(bad),
        "degenerate_why": bad[0].get("degenerate_why") if bad else None,
    }


@dataclass
class TablePlan:
    """What a table command runs: its methods with a registered algorithm (the rest
    ``skipped``), the config overrides every method gets, and the seeds per method."""

    methods: list[Method]
    skipped: list[str]
    overrides: dict[str, Any]
    seeds: int


def plan_table(
    table: Table,
    *,
    seeds: int | None = None,
    rounds: int | None = None,
    quick: bool = False,
    extra: dict[str, Any] | None = None,
    skip_missing: bool = False,
) -> TablePlan:
    """Check a table before anything runs (user modules imported, scenario registered,
    every method's config valid) and say what runs: shared by ``reproduce`` and
    ``reproduce --estimate``."""
    from .data import SCENARIOS
    from .plugins import import_modules

    import_modules(table.run.get("imports"))  # a table of the user's own methods
    missing = missing_algorithms(table)
    if missing and not skip_missing:
        raise FedshiftError(
            f"table {table.id} needs algorithms that are not registered: {', '.join(missing)}; "
            "run the others with --skip-missing"
        )
    scenario = RunConfig().scenario if "scenario" not in table.run else table.run["scenario"]
    if scenario not in SCENARIOS:
        raise FedshiftError(
            f"table {table.id} needs scenario {scenario!r}, which is not registered; "
            f"available: {', '.join(SCENARIOS.names())}"
        )
    methods = [m for m in table.methods if m.algorithm not in missing]
    skipped = [m.name for m in table.methods if m.algorithm in missing]
    if not methods:
        raise FedshiftError(f"no method of table {table.id} has a registered algorithm")
    overrides = dict(table.quick) if quick else {}
    overrides.update(extra or {})
    if rounds is not None:
        overrides["rounds"] = rounds
    k = seeds if seeds is not None else (1 if quick else table.seeds)
    if k < 1:
        raise FedshiftError(f"--seeds {k} must be at least 1")
    for m in methods:  # validate every method's config before anything runs
        method_config(table, m, overrides)
    check_option_overrides(table, methods, overrides)
    return TablePlan(methods, skipped, overrides, k)


def run_table(
    table: Table,
    *,
    seeds: int | None = None,
    rounds: int | None = None,
    quick: bool = False,
    db: str | Path = DEFAULT_DB,
    skip_missing: bool = False,
    extra: dict[str, Any] | None = None,
    progress=None,
    resume: bool = False,
    first_seed: int = 0,
) -> tuple[list[MethodResult], list[str]]:
    """Run every method of ``table`` for ``seeds`` seeds; returns the results and the
    methods skipped because their algorithm is not registered. With ``resume``, a run of
    the same configuration already in the store is reused when done and continued from its
    checkpoint when stopped (:func:`earlier_run`), so a paper-scale table spans sessions.
    Seeds are ``first_seed … first_seed + seeds − 1``: a table run on seeds other than the
    one its settings were selected with starts past it."""
    from .api import resume as resume_api
    from .api import run as run_api
    from .engine.runner import Diverged

    if first_seed < 0:
        raise FedshiftError(f"--first-seed {first_seed} must be 0 or more")
    plan = plan_table(
        table, seeds=seeds, rounds=rounds, quick=quick, extra=extra, skip_missing=skip_missing
    )
    methods, skipped, overrides, k = plan.methods, plan.skipped, plan.overrides, plan.seeds
    sweep = table.sweep_values if table.sweep_key else [None]
    data_for = ScenarioCache(table)

    from .results.store import new_group

    group = new_group("table")  # the runs this command starts (reused ones keep theirs)
    results = []
    for m in methods:
        run_ids, per_seed = [], []
        for seed in range(first_seed, first_seed + k):
            sweep_metrics = []
            for value in sweep:
                cfg = method_config(table, m, {**overrides, "seed": seed})
                if value is not None:
                    apply(cfg, {table.sweep_key: value})
                label = f"{m.name} (seed {seed}{'' if value is None else f', {value}'})"
                before = earlier_run(db, cfg) if resume else None
                # done without final metrics (killed after its last round): resume repairs it
                if before is not None and before["status"] == "done" and before["metrics"]:
                    run_ids.append(before["run_id"])  # finished in an earlier session
                    sweep_metrics.append(before["metrics"])
                    continue
                if before is not None:
                    label += f" (resumed {before['run_id']})"
                on_round, stop = progress(cfg.rounds, label) if progress else (None, None)
                try:
                    if before is not None:
                        out = resume_api(
                            before["run_id"],
                            db,
                            data=data_for(cfg),
                            on_round=on_round,
                            progress=False if progress else None,
                        )
                    else:
                        out = run_api(
                            cfg,
                            data=data_for(cfg),
                            db=db,
                            on_round=on_round,
                            progress=False if progress else None,
                            group=group,
                        )
                except Diverged as e:  # a result of the table, not the end of it
                    run_ids.append(e.run_id)
                    sweep_metrics.append(diverged_metrics(str(e)))
                    continue
                finally:
                    if stop is not None:
                        stop()
                run_ids.append(out.run_id)
                sweep_metrics.append(out.metrics)
            if table.sweep_key:
                per_seed.append(
                    _combine_sweep(sweep_metrics, table.sweep_key.split(".")[-1], sweep)
                )
            else:
                per_seed.append(sweep_metrics[0])
        mean, std = {}, {}
        for key in METRICS:
            mean[key], std[key] = _mean_std([s.get(key) for s in per_seed])
            if k == 1:  # one seed: no spread to report
                std[key] = None
        envs = list(dict.fromkeys(e for s in per_seed for e in s["per_env"]))
        per_env = {e: _mean_std([s["per_env"].get(e) for s in per_seed])[0] for e in envs}
        results.append(MethodResult(m, run_ids, per_seed, mean, std, per_env))
    return results, skipped


# where and how a run ran and was logged, not what it is
MACHINE_KEYS = ("device", "data_dir", "tracking", "threads", "execution")


def _identity(config: dict) -> str:
    kept = {
        k: v for k, v in config.items() if k not in MACHINE_KEYS and not k.startswith("tracking.")
    }
    return json.dumps(kept, sort_keys=True, default=str)


def earlier_run(db: str | Path, cfg: RunConfig) -> dict | None:
    """The store's run of exactly this configuration (device and data folder aside): the
    newest finished one, else the newest stopped one (interrupted, failed or diverged),
    else None. One still running in another process is refused: two processes must not
    train it."""
    from .results.store import RunStore

    if not Path(db).exists():
        return None
    key = _identity(json.loads(json.dumps(cfg.flat(), default=str)))
    same = [r for r in RunStore(db).runs() if r["config"] and _identity(r["config"]) == key]
    for status in ("done", "interrupted", "failed", "diverged"):
        found = [r for r in same if r["status"] == status]
        if found:
            return found[-1]
    if same:
        raise FedshiftError(
            f"run {same[-1]['run_id']} of this configuration is still running in another "
            "process; wait for it or stop it before --resume"
        )
    return None


def _mean_std(values: list) -> tuple[float | None, float | None]:
    mu, sd = mean_std([v for v in values if v is not None])
    return (None, None) if math.isnan(mu) else (mu, sd)


# ---------------------------------------------------------------- comparison


MIN_SEEDS = 3  # a published gap is tested only with at least this many seeds per method
ALPHA = 0.05  # one-sided paired t-test level for "our difference exceeds the seed noise"


def gap_test(better: list, worse: list) -> tuple[str, float | None]:
    """Whether our numbers keep a published gap ``better > worse``, beyond seed noise.

    Every method runs on the same partitions for a given seed, so the seeds pair: a
    one-sided paired t-test (SciPy's ``ttest_rel``) of our per-seed differences. Returns a
    status — ``held`` (right sign, p < ALPHA), ``within noise`` (right sign, not
    significant), ``tie`` (equal means), ``reversed`` (wrong sign, significant the other
    way), ``reversed, within noise``, or ``untested`` (fewer than MIN_SEEDS paired seeds) —
    and the p-value of the published direction.
    """
    from scipy.stats import ttest_rel

    pairs = [(a, b) for a, b in zip(better, worse, strict=False) if a is not None and b is not None]
    diffs = [a - b for a, b in pairs]
    if not diffs:
        return "untested", None
    mean = sum(diffs) / len(diffs)
    if len(diffs) < MIN_SEEDS:
        return "untested", None
    if all(d == diffs[0] for d in diffs):  # no spread: the sign alone decides
        p = 0.0 if mean > 0 else 1.0
    else:
        p = float(
            ttest_rel([a for a, _ in pairs], [b for _, b in pairs], alternative="greater").pvalue
        )
    if mean == 0:
        return "tie", p
    if mean > 0:
        return ("held" if p < ALPHA else "within noise"), p
    return ("reversed" if 1.0 - p < ALPHA else "reversed, within noise"), p


def compare(table: Table, results: list[MethodResult]) -> dict[str, dict]:
    """Per published metric: Spearman / Kendall rank correlation between the published
    and our means over the methods whose models are not degenerate, and every published
    gap ≥ ``table.gap`` with its :func:`gap_test` status. A gap with a degenerate model on
    either side is never held (status ``degenerate``)."""
    from scipy.stats import kendalltau, spearmanr

    out = {}
    for metric in table.metrics:
        scored = [r for r in results if metric in r.method.published and r.mean[metric] is not None]
        rows = [(r.method.name, r.method.published[metric], r.mean[metric]) for r in scored]
        sound = [row for row, r in zip(rows, scored, strict=True) if not r.degenerate]
        entry: dict[str, Any] = {
            "methods": len(sound),
            "degenerate": [r.method.name for r in scored if r.degenerate],
            "spearman": None,
            "kendall": None,
        }
        if len(sound) >= 3:
            pub = [p for _, p, _ in sound]
            ours = [o for _, _, o in sound]
            rho = spearmanr(pub, ours).statistic
            tau = kendalltau(pub, ours).statistic
            entry["spearman"] = None if math.isnan(rho) else float(rho)
            entry["kendall"] = None if math.isnan(tau) else float(tau)
        gaps = []
        for ra, rb in itertools.permutations(scored, 2):
            pa, pb = ra.method.published[metric], rb.method.published[metric]
            if pa - pb < table.gap:
                continue
            if ra.degenerate or rb.degenerate:
                status, p = "degenerate", None
            else:
                status, p = gap_test(ra.values(metric), rb.values(metric))
            gaps.append(
                {
                    "better": ra.method.name,
                    "worse": rb.method.name,
                    "published_gap": round(pa - pb, 2),
                    "our_gap": round(ra.mean[metric] - rb.mean[metric], 2),
                    "status": status,
                    "p_value": None if p is None else round(p, 4),
                    "holds": status == "held",
                }
            )
        gaps.sort(key=lambda g: -g["published_gap"])
        entry["gaps"] = gaps
        entry["gaps_held"] = sum(g["holds"] for g in gaps)
        entry["gap_status"] = {
            st: sum(g["status"] == st for g in gaps)
            for st in dict.fromkeys(g["status"] for g in gaps)
        }
        entry["published_order"] = [n for n, _, _ in sorted(rows, key=lambda r: -r[1])]
        entry["our_order"] = [n for n, _, _ in sorted(rows, key=lambda r: -r[2])]
        out[metric] = entry
    return out


# ---------------------------------------------------------------- report


def _f(v, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _pm(mean, std) -> str:
    if mean is None:
        return "—"
    return f"{mean:.1f} ± {std:.1f}" if std is not None else f"{mean:.1f}"


def write_reproduction_report(
    table: Table,
    results: list[MethodResult],
    skipped: list[str],
    comparison: dict,
    out_dir: str | Path,
    db: str | Path,
    settings: dict[str, Any],
) -> Path:
    """``report.md`` (published beside ours, ordering comparison), a per-environment plot,
    a published-vs-ours plot, and the per-run report of results/report.py under runs/."""
    from .results.plots import per_env_figure, save
    from .results.report import FIGURES, _md_table, write_report
    from .results.store import RunStore

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    head = ["method", "algorithm"]
    for m in table.metrics:
        head += [f"{m} (published)", f"{m} (ours)"]
    head += ["runs"]
    rows = []
    for r in results:
        row = [r.method.name + degenerate_mark(r), f"`{r.method.algorithm}`"]
        for m in table.metrics:
            row += [_f(r.method.published.get(m)), _pm(r.mean[m], r.std[m])]
        row.append(str(len(r.run_ids)))
        rows.append(row)
    for name in skipped:
        method = next(m for m in table.methods if m.name == name)
        row = [name, f"`{method.algorithm}` (not registered, skipped)"]
        for m in table.metrics:
            row += [_f(method.published.get(m)), "—"]
        rows.append(row + ["0"])
    k = len(results[0].per_seed)
    first = int(settings.get("first_seed", 0))
    seed_list = f"{k} seed(s)" if first == 0 else f"{k} seed(s), {first}–{first + k - 1}"
    parts = [
        f"# Reproduction of {table.source or table.id}: {table.title}",
        f"Table `{table.id}`; scenario `{settings['scenario']}` with options "
        f"`{settings['scenario_options']}`; {settings['rounds']} rounds; {seed_list} "
        f"({'quick run' if settings['quick'] else 'full run'}); run store `{db}`. "
        "Accuracies in %; ours are mean ± std over seeds; every method ran on the same "
        "partitions for a given seed.",
    ]
    if settings.get("overrides"):
        changed = ", ".join(f"`{k} = {v}`" for k, v in settings["overrides"].items())
        parts.append(f"Settings changed from the table's (`--set`): {changed}.")
    if settings.get("not_run"):
        parts.append(
            "Methods of the table not run (`--methods` chose the others): "
            + ", ".join(settings["not_run"])
            + "."
        )
    if table.notes:
        parts.append(f"Notes: {table.notes}")
    tuned = [("all methods", k, v) for k, v in table.tuned.items()] + [
        (r.method.name, k, v) for r in results for k, v in r.method.tuned.items()
    ]
    if tuned:
        parts.append(
            "### Settings the paper does not give (chosen on validation data)\n\n"
            + _md_table(["method", "setting", "how it was chosen"], [list(t) for t in tuned])
        )
    parts.append(_md_table(head, rows))
    bad = [r for r in results if r.degenerate]
    if bad:
        parts.append(
            "**Degenerate models** (marked †: a model that answers one class everywhere, or "
            "whose training loss stayed at ln K, or a run that diverged; they count in no gap "
            "and no rank correlation): "
            + "; ".join(
                f"{r.method.name} ({r.degenerate_seeds} of {len(r.per_seed)} seeds: "
                f"{next(s.get('degenerate_why') for s in r.per_seed if s.get('degenerate'))})"
                for r in bad
            )
            + "."
        )
    parts.append("## Ordering compared")
    parts.append(
        f"A published gap of at least {table.gap:g} points is **held** only when our "
        f"difference has the published sign and exceeds the seed noise: a one-sided paired "
        f"t-test over seeds (every method ran on the same partitions for a seed) with "
        f"p < {ALPHA:g}, and at least {MIN_SEEDS} seeds. Otherwise its status says why: "
        "*within noise*, *tie*, *reversed* (significant the other way), *reversed, within "
        "noise*, *untested* (fewer seeds) or *degenerate*. Rank correlations leave out "
        "degenerate models."
    )
    for metric, c in comparison.items():
        lines = [
            f"**{metric}** over {c['methods']} non-degenerate methods: Spearman ρ = "
            f"{_f(c['spearman'], 2)}, Kendall τ = {_f(c['kendall'], 2)}.",
            f"Published order: {' > '.join(c['published_order']) or '—'}.",
            f"Our order: {' > '.join(c['our_order']) or '—'}.",
        ]
        if c["gaps"]:
            counts = ", ".join(f"{v} {k}" for k, v in c["gap_status"].items())
            lines.append(
                f"Published gaps of at least {table.gap:g} points held beyond seed noise: "
                f"{c['gaps_held']} of {len(c['gaps'])} ({counts})."
            )
            lines.append(
                _md_table(
                    ["better", "worse", "published gap", "our gap", "p", "status"],
                    [
                        [
                            g["better"],
                            g["worse"],
                            _f(g["published_gap"]),
                            _f(g["our_gap"]),
                            _f(g["p_value"], 3),
                            g["status"] if g["holds"] else f"**{g['status']}**",
                        ]
                        for g in c["gaps"]
                    ],
                )
            )
        else:
            lines.append(f"No published gap reaches {table.gap:g} points.")
        parts.append("\n\n".join(lines))
    if skipped:
        parts.append(f"Skipped (algorithm not registered): {', '.join(skipped)}.")

    # plots: our per-environment accuracy (mean ± std over seeds), and published vs ours
    save(per_env_figure(seed_series(results, settings["scenario"])), out / "accuracy_per_env.png")
    parts.append("## Accuracy per test environment\n\n![per environment](accuracy_per_env.png)")
    published = published_figure(table, results)
    if published is not None:
        save(published, out / "published_vs_ours.png")
        parts.append("## Published against ours\n\n![published vs ours](published_vs_ours.png)")
    first_seed = [  # each method's first seed that did not diverge
        next((i for i, m in zip(r.run_ids, r.per_seed, strict=True) if not m.get("diverged")), None)
        for r in results
    ]
    runs_report = write_report(RunStore(db), [i for i in first_seed if i], out / "runs", "md")
    parts.append(
        f"Per-run details (first seed of each method, {len(FIGURES)} plots): "
        f"[{runs_report.relative_to(out)}]({runs_report.relative_to(out)})."
    )
    path = out / "report.md"
    path.write_text("\n\n".join(parts) + "\n")
    return path


def degenerate_mark(r: MethodResult) -> str:
    if any(s.get("diverged") for s in r.per_seed):
        return " †diverged"
    return " †degenerate" if r.degenerate else ""


def seed_series(results: list[MethodResult], scenario: str) -> list:
    """One plotted series per method: its seeds, drawn as their mean ± std."""
    from .results.plots import Series

    out = []
    for r in results:
        seeds = [m for m in r.per_seed if not m.get("diverged")]  # no numbers to draw
        if seeds:
            mark = f" (mean ± std of {len(seeds)} seeds)" if len(seeds) > 1 else ""
            out.append(
                Series(
                    r.method.name + mark + degenerate_mark(r),
                    [{"scenario": scenario, "metrics": m} for m in seeds],
                )
            )
    return out


def published_figure(table: Table, results: list[MethodResult]):
    """Published against our accuracy, ours with ±1 std over seeds; None if no method has
    a published number."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    drawn = False
    low = 100.0  # the lowest point or error bar: the axes start below it, not at 0
    for metric, marker in zip(table.metrics, "os^", strict=False):
        pts = [
            (
                r.method.published[metric],
                r.mean[metric],
                r.method.name + degenerate_mark(r),
                r.std[metric] or 0.0,
            )
            for r in results
            if metric in r.method.published and r.mean[metric] is not None
        ]
        if not pts:
            continue
        drawn = True
        low = min(low, *(min(p[0], p[1] - p[3]) for p in pts))
        # ours: mean over seeds, error bar ±1 std
        label = f"{metric} (ours: mean ± std over seeds)"
        ax.errorbar(
            [p[0] for p in pts],
            [p[1] for p in pts],
            yerr=[p[3] for p in pts],
            fmt=marker,
            capsize=3,
            label=label,
        )
        # neighbours (sorted by position) alternate above / below so close labels stay legible
        for i, (p, o, name, _) in enumerate(sorted(pts)):
            dy = 3 if i % 2 == 0 else -9
            ax.annotate(name, (p, o), fontsize=7, xytext=(3, dy), textcoords="offset points")
    if not drawn:
        plt.close(fig)
        return None
    # axes from a multiple of 10 below the lowest point, so close methods spread out
    lo = max(0.0, 10.0 * math.floor((low - 5.0) / 10.0))
    ax.plot([lo, 100], [lo, 100], ":", color="grey")
    ax.set(xlabel="published accuracy (%)", ylabel="our accuracy (%)")
    ax.set(xlim=(lo, 100), ylim=(lo, 100))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def summary(table: Table, results: list[MethodResult], skipped, comparison, report) -> dict:
    """The JSON line of ``fedshift reproduce --json``."""
    return {
        "table": table.id,
        "report": str(report),
        "methods": [
            {
                "name": r.method.name,
                "algorithm": r.method.algorithm,
                "published": r.method.published,
                "ours": {m: r.mean[m] for m in METRICS},
                "ours_std": {m: r.std[m] for m in METRICS},
                "degenerate": r.degenerate,
                "degenerate_seeds": r.degenerate_seeds,
                "run_ids": r.run_ids,
            }
            for r in results
        ],
        "skipped": skipped,
        "comparison": comparison,
    }


def reproduce(
    source: str,
    *,
    seeds: int | None = None,
    rounds: int | None = None,
    quick: bool = False,
    out_dir: str | Path | None = None,
    db: str | Path = DEFAULT_DB,
    skip_missing: bool = False,
    extra: dict[str, Any] | None = None,
    progress=None,
    methods: list[str] | None = None,
    resume: bool = False,
    first_seed: int = 0,
) -> dict:
    """Run a table (or the ``methods`` of it named) and write its report; returns the
    :func:`summary` dict."""
    full = load_table(source)
    table = select_methods(full, methods)
    results, skipped = run_table(
        table,
        seeds=seeds,
        rounds=rounds,
        quick=quick,
        db=db,
        skip_missing=skip_missing,
        extra=extra,
        progress=progress,
        resume=resume,
        first_seed=first_seed,
    )
    comparison = compare(table, results)
    first = method_config(
        table, results[0].method, {**(table.quick if quick else {}), **(extra or {})}
    )
    settings = {
        "scenario": first.scenario,
        "scenario_options": first.scenario_options,
        "rounds": rounds if rounds is not None else first.rounds,
        "quick": quick,
        "overrides": {k: v for k, v in (extra or {}).items() if k not in ("device", "data_dir")},
        "not_run": [m.name for m in full.methods if m not in table.methods],
        "first_seed": first_seed,
    }
    out = Path(out_dir) if out_dir is not None else Path("reproduce") / table.id
    report = write_reproduction_report(table, results, skipped, comparison, out, db, settings)
    return summary(table, results, skipped, comparison, report)
