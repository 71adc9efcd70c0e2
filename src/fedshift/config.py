"""Run configuration: presets / TOML files plus dotted ``--set key=value`` overrides,
resolved into one validated :class:`RunConfig`.

Top-level keys are the fields of :class:`RunConfig`; ``algorithm.<hp>``, ``scenario.<option>``
and ``model.<option>`` go to the chosen algorithm's, scenario's and model's own option
dataclasses, which validate them. In TOML, tables work too: ``[scenario] name = "dirichlet"
alpha = 0.1`` is the same as ``scenario = "dirichlet"`` plus ``scenario.alpha = 0.1``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

from .engine.execution import EXECUTIONS
from .errors import FedshiftError, did_you_mean
from .options import _convert, build_options, require
from .tracking import TrackingOptions, check_trackers

SECTIONS = ("algorithm", "scenario", "model", "faults", "tracking")
ALIASES = {"checkpoint.every": "checkpoint_every"}


@dataclass
class RunConfig:
    algorithm: str = "fedavg"
    scenario: str = "digits-shortcut"
    model: str = "auto"  # auto = the scenario's default model
    rounds: int = 20
    seed: int = 0
    lr: float = 0.05
    batch_size: int = 10
    local_epochs: int = 1
    local_steps: int = 0  # > 0: fixed steps per round instead of epochs
    momentum: float = 0.0
    weight_decay: float = 0.0
    participation: float = 0.0  # 0 = the scenario's default
    clients_per_round: int = 0  # > 0: sample this many clients instead of a rate
    cohort_size: int = 0  # 0 = all sampled clients in one batched cohort
    eval_every: int = 0  # 0 = about ten evaluations per run
    checkpoint_every: int = 10  # rounds between checkpoints (0 = only at the end / on stop)
    device: str = "auto"  # cuda if available, else mps, else cpu (resolved when run)
    compile: bool = False
    # local steps: batched over the cohort, client after client, or auto (timed, the faster)
    execution: str = "auto"
    threads: int = 0  # intra-op threads of this process (0 = PyTorch's default, the cores)
    data_dir: str = ""
    tracking: list[str] = field(default_factory=list)  # "tensorboard", "mlflow" (fedshift.tracking)
    # users' modules that register algorithms / scenarios / models (fedshift.plugins),
    # imported when the config is resolved: module names, or paths to .py files
    imports: list[str] = field(default_factory=list)
    algorithm_options: dict[str, Any] = field(default_factory=dict)
    scenario_options: dict[str, Any] = field(default_factory=dict)
    model_options: dict[str, Any] = field(default_factory=dict)
    faults_options: dict[str, Any] = field(default_factory=dict)
    tracking_options: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> RunConfig:
        require(0 <= self.rounds <= 10**7, f"rounds must lie in 0..10^7, got {self.rounds}")
        require(0 <= self.seed < 2**32, f"seed must lie in 0..2^32-1, got {self.seed}")
        require(self.lr > 0, f"lr must be positive, got {self.lr}")
        require(
            0 <= self.batch_size <= 10**6,
            f"batch_size must lie in 0..10^6 (0 = full batch), got {self.batch_size}",
        )
        require(
            1 <= self.local_epochs <= 10**4,
            f"local_epochs must lie in 1..10^4, got {self.local_epochs}",
        )
        require(
            0 <= self.local_steps <= 10**7,
            f"local_steps must lie in 0..10^7 (0 = use local_epochs), got {self.local_steps}",
        )
        require(
            not (self.local_steps and self.local_epochs != 1),
            f"local_steps={self.local_steps} and local_epochs={self.local_epochs} are both set; "
            "local_steps > 0 replaces epochs by that many steps, so give one of them "
            "(local_epochs stays at its default 1 with local_steps)",
        )
        require(self.momentum >= 0, f"momentum must be >= 0, got {self.momentum}")
        require(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        require(
            0 <= self.participation <= 1,
            f"participation must lie in [0, 1] (0 = scenario default), got {self.participation}",
        )
        require(self.clients_per_round >= 0, "clients_per_round must be >= 0")
        require(
            self.cohort_size >= 0, f"cohort_size must be >= 0 (0 = all), got {self.cohort_size}"
        )
        require(self.eval_every >= 0, f"eval_every must be >= 0, got {self.eval_every}")
        require(self.checkpoint_every >= 0, "checkpoint_every must be >= 0 (0 = end/stop only)")
        require(
            self.device in ("auto", "cpu", "mps") or self.device.startswith("cuda"),
            f"device {self.device!r} is not supported; use auto, cpu, cuda, cuda:N or mps",
        )
        require(
            0 <= self.threads <= 4096,
            f"threads must lie in 0..4096 (0 = PyTorch's default), got {self.threads}",
        )
        require(
            self.execution in EXECUTIONS,
            f"execution {self.execution!r} is not one of {', '.join(EXECUTIONS)} (auto times "
            "both on the first step and keeps the faster)",
        )
        self.tracking = list(dict.fromkeys(t.strip() for t in self.tracking if t.strip()))
        check_trackers(self.tracking)
        build_options(TrackingOptions, self.tracking_options, "tracking")
        return self

    def flat(self) -> dict[str, Any]:
        """The resolved config as dotted keys (what the run store records); ``imports``,
        ``execution`` and ``threads`` only when not at their defaults, so runs that do not
        use them keep the keys runs always had (and match runs stored before them)."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if not k.endswith("_options")}
        for key, default in (("imports", []), ("execution", "auto"), ("threads", 0)):
            if out[key] == default:
                del out[key]
        for sec in SECTIONS:
            for k, v in getattr(self, f"{sec}_options").items():
                out[f"{sec}.{k}"] = v
        return out


_TOP = {f.name: f for f in dataclasses.fields(RunConfig) if not f.name.endswith("_options")}


def parse_toml(text: str, what: str) -> dict[str, Any]:
    """TOML text as a dict; bad or absurdly nested TOML → one sentence naming ``what``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FedshiftError(f"{what} is not valid TOML: {e}") from None
    except RecursionError:
        raise FedshiftError(
            f"{what} nests its arrays or tables deeper than can be read; "
            "a fedshift config needs at most a few levels"
        ) from None


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        elif key.endswith(".name") and key[: -len(".name")] in SECTIONS:
            out[key[: -len(".name")]] = v
        else:
            out[key] = v
    return out


def apply(cfg: RunConfig, values: dict[str, Any]) -> RunConfig:
    """Apply dotted ``values`` (strings from the CLI or TOML values) to ``cfg`` in place."""
    hints = typing.get_type_hints(RunConfig)
    for key, raw in values.items():
        key = ALIASES.get(key, key)
        sec, _, sub = key.partition(".")
        if sub and sec in SECTIONS:
            getattr(cfg, f"{sec}_options")[sub] = raw
        elif key in _TOP:
            setattr(cfg, key, _convert(key, hints[key], raw))
        else:
            allowed = ", ".join(list(_TOP) + [f"{s}.<option>" for s in SECTIONS])
            hint = did_you_mean(key, list(_TOP) + list(ALIASES))
            raise FedshiftError(f"unknown config key {key!r}{hint}; allowed keys: {allowed}")
    return cfg


def parsed(value: Any) -> Any:
    """A value given as text on the command line read as the number, boolean or list it
    spells (``"0.01"`` → 0.01, ``"true"`` → True, ``"[8,16]"`` → [8, 16]); other text and
    non-text values as they are. The store keeps ``--set`` values as text."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value.strip())
    except ValueError:
        low = value.strip().lower()
        return {"true": True, "false": False, "none": None}.get(low, value.strip())


def canonical(value: Any) -> Any:
    """What a config value means, however it was written: ``"0.01"`` (from ``--set``),
    ``1e-2`` and ``0.01`` (from TOML) are the same float, as are 1 and 1.0; ``"true"`` is
    True; lists element-wise."""
    value = parsed(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


def parse_set(items: list[str]) -> dict[str, str]:
    """``key=value`` items; the same key (or its alias) twice with different values is an
    error rather than a silent win of the last."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise FedshiftError(f"--set {item!r} is not of the form key=value")
        same = [k for k in out if ALIASES.get(k, k) == ALIASES.get(key, key)]
        if same and canonical(out[same[0]]) != canonical(value):
            raise FedshiftError(
                f"--set gives {key!r} twice with different values ({same[0]}={out[same[0]]}, "
                f"{key}={value}); give it once"
            )
        out[key] = value
    return out


def add_options(overrides: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` (from ``--set``) plus a command's own options (``--rounds 3`` …, None =
    not given); ``--set rounds=5 --rounds 3`` is an error naming both, the same value twice
    is not."""
    out = dict(overrides)
    for key, value in options.items():
        if value is None:
            continue
        if key in out and canonical(out[key]) != canonical(value):
            flag = "--" + key.replace("_", "-")
            raise FedshiftError(
                f"{key} is given twice with different values (--set {key}={out[key]} and "
                f"{flag} {value}); give it once"
            )
        out[key] = value
    return out


def command_configs(
    source: Any,
    set_items: list[str] | None,
    options: dict[str, Any],
    seeds: str | None,
    build: Callable[[dict[str, Any]], RunConfig] | None = None,
) -> list[RunConfig]:
    """The configs one command line asks for (``fedshift run`` and ``flower run``): its
    ``--set`` items plus its own options (:func:`add_options`), one config per ``--seeds``
    entry, or one with the config's seed. ``build`` makes a config from those overrides
    (a paper table's row: ``reproduce.Row.config``); by default :func:`resolve` of
    ``source``."""
    overrides = add_options(parse_set(set_items or []), options)
    seed_list = parse_seeds(seeds) if seeds is not None else [None]
    if seeds is not None and "seed" in overrides:
        raise FedshiftError("--seeds runs one run per seed; give it without --seed or seed=")
    if build is None:
        build = functools.partial(resolve, source)
    return [build(overrides if s is None else {**overrides, "seed": s}) for s in seed_list]


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` → ``[0, 1, 2]``; one clear sentence for anything else."""
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds):
        raise FedshiftError(f"--seeds {text!r} must be distinct integers separated by commas")
    return seeds


PRESET_PACKAGE = "fedshift.presets"  # run presets: one run config each
TABLE_PACKAGE = "fedshift.configs"  # paper tables: `fedshift reproduce` reads them


def _bundled_names(package: str) -> list[str]:
    files = resources.files(package)
    return sorted(p.name[:-5] for p in files.iterdir() if p.name.endswith(".toml"))


def preset_names() -> list[str]:
    return _bundled_names(PRESET_PACKAGE)


def preset_text(name: str) -> str:
    return resources.files(PRESET_PACKAGE).joinpath(f"{name}.toml").read_text()


def table_names() -> list[str]:
    return _bundled_names(TABLE_PACKAGE)


def table_text(name: str) -> str:
    return resources.files(TABLE_PACKAGE).joinpath(f"{name}.toml").read_text()


def load_source(source: str) -> dict[str, Any]:
    """Dotted keys of a preset name or a TOML file path."""
    path = Path(source)
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise FedshiftError(f"config file {source!r} does not exist")
        if not path.is_file():
            raise FedshiftError(f"{source!r} is a directory; give a TOML file or a preset name")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise FedshiftError(f"config file {source!r} cannot be read: {e}") from None
    elif source in preset_names():
        text = preset_text(source)
    else:
        tables = table_names()
        if source in tables:
            raise FedshiftError(_table_given(source))
        raise FedshiftError(
            f"{source!r} is neither a TOML file nor a run preset or paper table"
            f"{did_you_mean(source, preset_names() + tables)}; run presets: "
            f"{', '.join(preset_names())}; paper tables: fedshift list presets"
        )
    raw = parse_toml(text, f"config {source!r}")
    if "table" in raw or "method" in raw:  # no run config has these keys
        raise FedshiftError(_table_given(source))
    return _flatten(raw)


def _table_given(source: str) -> str:
    return (
        f"{source!r} is a paper table, not a run config: run one of its methods with "
        f"fedshift run {source} --method NAME, or all of them with fedshift reproduce {source}"
    )


def resolve(source: str | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The validated config of a preset or TOML file plus overrides; its ``imports`` are
    imported here, so the names they register can be checked at once."""
    from .plugins import import_modules

    cfg = RunConfig()
    if source:
        apply(cfg, load_source(source))
    apply(cfg, overrides or {})
    cfg.imports = import_modules(cfg.imports)
    return cfg.validate()
