"""Paper tables as data: the schema ``fedshift reproduce`` reads, loading and checking a
table, and the config of each of its methods (rows).

A table is data, one TOML file per paper table in ``configs/`` (shipped inside the package
as ``fedshift/configs``)::

    [table]
    id = "thesis-5.1-cmnist8"          # the file name without .toml
    title = "..."                        # one line
    source = "thesis Table 5.1"
    metrics = ["worst", "average"]      # the published metrics (worst, average,
                                         # worst_client; "accuracy" = average)
    seeds = 3                            # default K (--seeds overrides)
    first_seed = 1                       # optional (default 0): the first seed (--first-seed
                                         # overrides); past a seed a selection was made on
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
validation data and what it found. ``untuned`` records the settings the paper does not give
that no validation chose (ours, by hand: say why), and ``given`` the settings taken from the
paper (say where). Every recorded key must be a key the table sets, or an option of the
method's algorithm (a module default stated as such), and sits in one record only (checked on
load; in ``[table]`` a record may also name an option several methods set). The report
lists each record in its own section, and names under "Settings with no record" each of the
table's hyper-parameters (:data:`RECORDED_KEYS`, every method's options) that none accounts
for.

Every method runs on the same partitions: for seed k all methods use the scenario built
with seed k (or ``scenario_seed`` when set), built once and shared. Each run is recorded
in the run store; the report (Markdown, with plots) gives our mean ± std over seeds beside
the published number, the rank correlation of the two orderings (Spearman and Kendall,
SciPy) and, for every pair of methods whose published numbers differ by at least ``gap``
points, whether our numbers keep that order.
"""

from __future__ import annotations

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
from .eval.metrics import HEADLINE_METRICS as METRICS

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
    untuned: dict[str, str] = field(default_factory=dict)  # setting → why set by hand
    given: dict[str, str] = field(default_factory=dict)  # setting → where the paper gives it


@dataclass
class Table:
    id: str
    title: str
    source: str
    metrics: list[str]
    run: dict[str, Any]
    methods: list[Method]
    seeds: int = 1
    first_seed: int = 0  # seeds first_seed … first_seed + seeds − 1 (past a selection's seed)
    gap: float = 5.0
    scenario_seed: int | None = None
    quick: dict[str, Any] = field(default_factory=dict)
    sweep_key: str | None = None
    sweep_values: list[Any] = field(default_factory=list)
    notes: str = ""
    tuned: dict[str, str] = field(default_factory=dict)  # shared [run] setting → how chosen
    untuned: dict[str, str] = field(default_factory=dict)  # shared setting → why set by hand
    given: dict[str, str] = field(default_factory=dict)  # shared setting → the paper's place


# the settings whose choice a table must account for (tuned, untuned or given): the shared
# [run] hyper-parameters, every method's own overrides of them, and every option it sets
RECORDED_KEYS = (
    "rounds",
    "lr",
    "batch_size",
    "local_epochs",
    "local_steps",
    "momentum",
    "weight_decay",
    "participation",
)
RECORDS = ("tuned", "untuned", "given")


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
            *(_record(m, r) for r in RECORDS),
        )
        own = {f"algorithm.{k}" for k in method.options} | set(method.settings)
        unknown = sorted(set(method.tuned) - own)
        if unknown:
            raise FedshiftError(
                f"method {method.name!r} records how {unknown[0]!r} was tuned but does not set "
                "it; tuned keys must be the method's options (algorithm.NAME) or set keys"
            )
        for record in ("untuned", "given"):
            stray = sorted(
                k
                for k in getattr(method, record)
                if k not in own and not _module_option(method.algorithm, k)
            )
            if stray:
                raise FedshiftError(
                    f"method {method.name!r} records {stray[0]!r} as {record} but neither sets "
                    f"it nor has it as an option of {method.algorithm}; {record} keys must be "
                    "the method's options (algorithm.NAME) or set keys"
                )
        _one_record_each(getattr(method, r) for r in RECORDS)
        methods.append(method)
    if not methods:
        raise FedshiftError("the table lists no [[method]] entries")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise FedshiftError(f"method names must be distinct in a table, got {names}")
    sweep = raw.get("sweep", {})
    run = _flatten(dict(raw.get("run", {})))
    tuned, untuned, given = (_record(head, r) for r in RECORDS)
    options = {f"algorithm.{k}" for m in methods for k in m.options}
    unknown = sorted(set(tuned) - set(run) - options)
    if unknown:
        raise FedshiftError(
            f"the table records how {unknown[0]!r} was tuned but neither its [run] nor a "
            "method's options set it"
        )
    for record, keys in (("untuned", untuned), ("given", given)):
        stray = sorted(set(keys) - set(run) - options)
        if stray:
            raise FedshiftError(
                f"the table records {stray[0]!r} as {record} but neither its [run] nor a "
                "method's options set it"
            )
    _one_record_each([tuned, untuned, given])
    return Table(
        id=str(head.get("id", default_id)),
        title=str(head.get("title", default_id)),
        source=str(head.get("source", "")),
        metrics=metrics,
        run=run,
        methods=methods,
        seeds=int(head.get("seeds", 1)),
        first_seed=int(head.get("first_seed", 0)),
        gap=float(head.get("gap", 5.0)),
        scenario_seed=head.get("scenario_seed"),
        quick=_flatten(dict(raw.get("quick", {}))),
        sweep_key=sweep.get("key"),
        sweep_values=list(sweep.get("values", [])),
        notes=str(head.get("notes", "")),
        tuned=tuned,
        untuned=untuned,
        given=given,
    )


def _module_option(algorithm: str, key: str) -> bool:
    """Whether ``key`` names an option of ``algorithm`` (a module default a method may
    declare); any ``algorithm.NAME`` while the algorithm is not registered (a plugin)."""
    if not key.startswith("algorithm."):
        return False
    names = algorithm_option_names(algorithm)
    return not names or key.removeprefix("algorithm.") in names


def _record(raw: dict, record: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.get(record, {}).items()}


def _one_record_each(records) -> None:
    """A setting is tuned, untuned or given, not two of them."""
    seen: dict[str, int] = {}
    for i, record in enumerate(records):
        for key in record:
            if key in seen:
                raise FedshiftError(
                    f"{key!r} is recorded as both {RECORDS[seen[key]]} and {RECORDS[i]}; a "
                    "setting is tuned (by validation), untuned (by hand) or given (by the "
                    "paper)"
                )
            seen[key] = i


def unrecorded_settings(table: Table) -> list[tuple[str, str]]:
    """(method or "all methods", key) of each hyper-parameter the table sets that no
    ``tuned``, ``untuned`` or ``given`` record accounts for."""
    shared = {**table.tuned, **table.untuned, **table.given}
    out = [("all methods", k) for k in RECORDED_KEYS if k in table.run and k not in shared]
    for m in table.methods:
        own = {**m.tuned, **m.untuned, **m.given}
        keys = [k for k in RECORDED_KEYS if k in m.settings]
        keys += [f"algorithm.{k}" for k in m.options]
        out += [
            (m.name, k)
            for k in keys
            if k not in own and (k not in shared or not k.startswith("algorithm."))
        ]
    return out


# ---------------------------------------------------------------- methods


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
