"""Property-based fuzzing of everything a user types: config keys and values, TOML files
and command-line arguments. Whatever arrives, fedshift either starts training with a valid
config or stops before any work with one clear sentence and a non-zero exit — never a
traceback. The default run uses few examples; ``-m slow`` runs the long profile."""

from __future__ import annotations

import dataclasses
import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fedshift.algorithms import ALGORITHMS
from fedshift.cli import app
from fedshift.config import load_source, resolve
from fedshift.data.registry import SCENARIOS
from fedshift.engine.faults import FaultOptions
from fedshift.engine.runner import Runner
from fedshift.errors import FedshiftError
from fedshift.models.registry import MODELS

FAST = dict(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
LONG = dict(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
# scenarios that build in well under a second (scikit-learn digits, no files)
QUICK_SCENARIOS = ["digits-shortcut", "iid", "dirichlet", "pathological"]
TOP_KEYS = [
    "rounds",
    "seed",
    "lr",
    "batch_size",
    "local_epochs",
    "local_steps",
    "momentum",
    "weight_decay",
    "participation",
    "clients_per_round",
    "cohort_size",
    "eval_every",
    "checkpoint_every",
    "checkpoint.every",
    "device",
    "compile",
    "data_dir",
]


def option_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def section_keys() -> list[str]:
    keys = [f"faults.{k}" for k in option_names(FaultOptions)]
    for name in ALGORITHMS.names():
        keys += [f"algorithm.{k}" for k in option_names(ALGORITHMS.get(name).Hyper)]
    for name in QUICK_SCENARIOS:
        keys += [f"scenario.{k}" for k in option_names(SCENARIOS.get(name).options)]
    for name in MODELS.names():
        keys += [f"model.{k}" for k in option_names(MODELS.get(name).options)]
    return sorted(set(keys))


words = st.text(string.ascii_letters + string.digits + "._-[], ", max_size=12)
numbers = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1e400", "-0", "nan", "inf", "0x10", "1_000", "3.5", "", " "]),
)
values = st.one_of(
    numbers,
    words,
    st.booleans(),
    st.lists(st.one_of(st.integers(-5, 50), st.floats(-2, 2), words), max_size=4),
)
keys = st.one_of(
    st.sampled_from(TOP_KEYS + section_keys()),
    st.sampled_from(TOP_KEYS).map(lambda k: k[:-1] + "x"),  # typos
    words,
)
names = st.one_of(
    st.tuples(st.just("algorithm"), st.sampled_from(ALGORITHMS.names() + ["fedavgg", ""])),
    st.tuples(st.just("scenario"), st.sampled_from(QUICK_SCENARIOS + ["nosuch"])),
    st.tuples(st.just("model"), st.sampled_from(MODELS.names() + ["auto", "mlpp"])),
)
overrides = st.tuples(st.lists(names, max_size=3), st.dictionaries(keys, values, max_size=4)).map(
    lambda t: {**dict(t[0]), **t[1]}
)


def as_cli_value(v) -> str:
    if isinstance(v, list):
        return "[" + ",".join(map(str, v)) + "]"
    return str(v).lower() if isinstance(v, bool) else str(v)


class StartedTraining(Exception):
    """Raised in place of training: the input passed every check."""


@pytest.fixture
def no_training(monkeypatch):
    def started(self, result=None):
        raise StartedTraining

    monkeypatch.setattr(Runner, "run", started)


def cli_run(args: list[str], tmp_path) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(app, ["run", "--db", str(tmp_path / "f.db"), *args])
    return result.exit_code, result.output, result.exception


def check_cli(args, tmp_path):
    code, output, exc = cli_run(args, tmp_path)
    if isinstance(exc, StartedTraining):
        return  # valid input: every check passed and training would start
    assert "Traceback" not in output, output
    assert exc is None or isinstance(exc, SystemExit), f"{args}: {exc!r}"
    assert code != 0, f"{args} exited 0 without training"


def check_overrides(ov: dict, tmp_path):
    args = [a for k, v in ov.items() for a in ("--set", f"{k}={as_cli_value(v)}")]
    if "scenario.dataset" in ov:  # keep fuzzing offline and fast: only digits
        args += ["--set", "scenario.dataset=digits"]
    check_cli(args + ["--rounds", "1"], tmp_path)


@given(ov=overrides)
@settings(**FAST)
def test_random_config_keys_and_values_never_crash_the_run_command(ov, tmp_path, no_training):
    check_overrides(ov, tmp_path)


@pytest.mark.slow
@given(ov=overrides)
@settings(**LONG)
def test_random_config_keys_and_values_long_profile(ov, tmp_path, no_training):
    check_overrides(ov, tmp_path)


tokens = st.lists(
    st.one_of(
        st.sampled_from(
            ["--rounds", "--seed", "--seeds", "--set", "--cohort-size", "--device", "--json"]
            + ["--resume", "--data-dir", "-s", "--", "=", "digits-shortcut", "mnist-iid-fedavg"]
        ),
        words,
        numbers.map(str),
    ),
    max_size=6,
)


@given(args=tokens)
@settings(**FAST)
def test_random_command_lines_never_crash(args, tmp_path, no_training):
    check_cli(args, tmp_path)


@pytest.mark.slow
@given(args=tokens)
@settings(**LONG)
def test_random_command_lines_long_profile(args, tmp_path, no_training):
    check_cli(args, tmp_path)


toml_scalars = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.text(string.ascii_letters, max_size=8),
)
toml_docs = st.dictionaries(
    st.sampled_from(TOP_KEYS[:10] + ["algorithm", "scenario", "model", "zzz"]),
    st.one_of(
        toml_scalars,
        st.dictionaries(
            st.sampled_from(["name", "alpha", "mu", "clients", "hidden", "typo"]),
            st.one_of(toml_scalars, st.lists(st.integers(0, 300), max_size=3)),
            max_size=3,
        ),
    ),
    max_size=5,
)


def to_toml(doc: dict) -> str:
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v + '"'
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)

    flat = [f"{k} = {val(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    tables = [
        f"[{k}]\n" + "\n".join(f"{kk} = {val(vv)}" for kk, vv in v.items())
        for k, v in doc.items()
        if isinstance(v, dict)
    ]
    return "\n".join(flat + tables) + "\n"


@given(doc=toml_docs, garbage=st.one_of(st.just(""), st.text(max_size=20)))
@settings(**FAST)
def test_random_toml_files_are_accepted_or_refused_in_one_sentence(doc, garbage, tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(to_toml(doc) + garbage)
    try:
        resolve(str(path))
    except FedshiftError as e:
        assert "\n" not in str(e).strip() or "TOML" in str(e)


def test_the_fuzzer_reaches_both_outcomes(tmp_path, no_training):
    """Sanity: a valid config reaches training, a bad one is refused with exit 2."""
    code, _, exc = cli_run(["--rounds", "1"], tmp_path)
    assert isinstance(exc, StartedTraining)
    code, output, exc = cli_run(["--set", "rounds=1e400"], tmp_path)
    assert code == 2 and "rounds" in output and "Traceback" not in output
    with pytest.raises(FedshiftError, match="seed"):
        resolve(None, {"seed": "x"})
    with pytest.raises(FedshiftError, match="does not exist"):
        load_source(str(tmp_path / "missing.toml"))
    with pytest.raises(FedshiftError, match="is a directory"):
        load_source(str(tmp_path))
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00rounds")
    with pytest.raises(FedshiftError, match="cannot be read"):
        load_source(str(binary))


LONG_NAME = "a" * 300  # over every file system's 255-byte limit per name


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--db", f"{LONG_NAME}.db", "--rounds", "1"],
        ["run", f"{LONG_NAME}.toml"],
        ["reproduce", f"{LONG_NAME}.toml"],
        ["runs", "--db", f"{LONG_NAME}.db"],
        ["run", "--set", "scenario=from-partition", "--set", f"scenario.file={LONG_NAME}.json"],
    ],
    ids=["run-db", "run-source", "reproduce-source", "runs-db", "partition-file"],
)
def test_names_longer_than_the_file_system_allows_get_one_sentence(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    assert "too long" in result.output or "does not exist" in result.output, result.output


@pytest.mark.parametrize("command", ["run", "reproduce"])
def test_toml_nested_thousands_deep_gets_one_sentence(command, tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    result = CliRunner().invoke(app, [command, str(deep)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "nests" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "setting",
    [
        ["weight_decay=1e308"],
        ["lr=1e308"],
        ["cohort_size=1e308"],
        ["model.hidden=[100000,100000]"],  # 40 GB of parameters
        ["model.hidden=1e18"],
        ["model.hidden=[20000,20000,20000]"],  # fits once, not as a cohort
        ["algorithm=ftfa", "algorithm.finetune_epochs=1e18"],
        ["algorithm=pfedme", "algorithm.inner_steps=1e18"],
        ["algorithm=ifca", "algorithm.num_clusters=1e18"],
        ["algorithm=drfa", "algorithm.tau=1e18"],
    ],
)
def test_huge_sizes_are_refused_before_anything_is_built_or_recorded(
    setting, tmp_path, no_training, monkeypatch
):
    """The issue's cases: each crashed or hung after being recorded as a run."""
    from fedshift import experiment
    from fedshift.models import registry
    from fedshift.results.store import RunStore

    for module in (experiment, registry):  # the memory of the machine the issue ran on
        monkeypatch.setattr(module, "physical_memory", lambda: 24 * 2**30)
    args = [a for s in setting for a in ("--set", s)]
    code, output, exc = cli_run([*args, "--set", "scenario=digits-shortcut"], tmp_path)
    assert not isinstance(exc, StartedTraining), setting
    assert code == 2 and "Traceback" not in output, (setting, output, exc)
    db = tmp_path / "f.db"
    assert not db.exists() or RunStore(db).runs() == []  # nothing recorded


@pytest.mark.parametrize("command", ["report", "compare", "demo"])
def test_out_under_a_file_gets_one_sentence(command, tmp_path, monkeypatch):
    """--out below a file (or below /dev/null): NotADirectoryError before, one line now."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("mine")
    db = tmp_path / "r.db"
    ids = []
    if command != "demo":
        res = CliRunner().invoke(
            app, ["run", "--set", "scenario=digits-shortcut", "--rounds", "1", "--db", str(db),
                  "--json"])  # fmt: skip
        ids = [json.loads(res.stdout.strip().splitlines()[-1])["run_id"], "--db", str(db)]
    res = CliRunner().invoke(app, [command, *ids, "--out", "afile/sub"])
    assert res.exit_code == 2 and "Not a directory" in res.output, (res.output, res.exception)
    assert (tmp_path / "afile").read_text() == "mine"


def test_a_read_only_store_is_one_sentence(tmp_path, monkeypatch):
    import sqlite3

    from fedshift.results.store import RunStore

    def readonly(self, *a, **k):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(RunStore, "start", readonly)
    res = CliRunner().invoke(
        app, ["run", "--set", "scenario=digits-shortcut", "--rounds", "1", "--db",
              str(tmp_path / "r.db")])  # fmt: skip
    assert res.exit_code == 2 and "read-only" in res.output, (res.output, res.exception)
