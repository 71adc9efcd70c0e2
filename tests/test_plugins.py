"""A user's own method or scenario, as a user brings it in: ``--import`` of a module name or
a .py file, installed packages' entry points, notebook re-registration, and a resume that
imports the recorded modules again in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedshift as fs
from fedshift import plugins
from fedshift.algorithms import ALGORITHMS
from fedshift.algorithms.base import register_algorithm
from fedshift.algorithms.fedavg import FedAvg
from fedshift.cli import app
from fedshift.data import SCENARIOS
from fedshift.errors import FedshiftError
from fedshift.models import MODELS
from fedshift.results.store import RunStore

SRC = Path(fs.__file__).resolve().parents[1]
FAST = ["--set", "scenario=digits-shortcut", "--set", "scenario.clients=3", "--rounds", "1"]

METHOD = '''
"""{doc}"""
from dataclasses import dataclass

from fedshift import opt, register_algorithm, require
from fedshift.algorithms.fedavg import FedAvg


@dataclass(frozen=True)
class Hyper:
    beta: float = opt(0.5, "a weight")

    def __post_init__(self):
        require(self.beta >= 0, f"algorithm.beta must be >= 0, got {{self.beta}}")


@register_algorithm("{name}")
class Method(FedAvg):
    Hyper = Hyper
'''


@pytest.fixture(autouse=True)
def clean_registries():
    """Whatever a test registers or imports is forgotten after it."""
    regs = [ALGORITHMS, SCENARIOS, MODELS]
    saved = [(dict(r._items), dict(r._origins), dict(r._plugins), r._scanned) for r in regs]
    for r in regs:
        r._scanned = False  # entry points a test installs are seen by names()
    imported, modules, path = dict(plugins._imported), set(sys.modules), list(sys.path)
    yield
    for r, (items, origins, plugs, scanned) in zip(regs, saved, strict=True):
        r._items, r._origins, r._plugins, r._scanned = items, origins, plugs, scanned
    plugins._imported.clear()
    plugins._imported.update(imported)
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    sys.path[:] = path


def write(folder: Path, module: str, algorithm: str, doc: str = "A method of mine.") -> Path:
    path = folder / f"{module}.py"
    path.write_text(METHOD.format(name=algorithm, doc=doc))
    return path


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_line_error(res, *words: str) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_import_a_module_from_the_current_folder_and_run_it(tmp_path, monkeypatch):
    write(tmp_path, "plugin_cwd", "plugin-cwd")
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "r.db"
    res = invoke("run", "--import", "plugin_cwd", "--set", "algorithm=plugin-cwd", *FAST,
                 "--set", "algorithm.beta=0.25", "--db", str(db), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["algorithm"] == "plugin-cwd"
    config = RunStore(db).run(summary["run_id"])["config"]
    assert config["imports"] == ["plugin_cwd"] and config["algorithm.beta"] == "0.25"
    listed = invoke("list", "algorithms", "--import", "plugin_cwd", "--json")
    mine = [a for a in json.loads(listed.stdout) if a["name"] == "plugin-cwd"]
    assert mine[0]["help"] == "A method of mine." and mine[0]["options"][0]["name"] == "beta"
    # the option is validated like a built-in's
    bad = invoke("run", "--import", "plugin_cwd", "--set", "algorithm=plugin-cwd", *FAST,
                 "--set", "algorithm.beta=-1", "--db", str(db))  # fmt: skip
    one_line_error(bad, "algorithm.beta must be >= 0")


def test_a_run_without_imports_stores_no_imports_key(tmp_path):
    db = tmp_path / "r.db"
    assert invoke("run", *FAST, "--db", str(db)).exit_code == 0
    assert "imports" not in RunStore(db).runs()[0]["config"]


def test_import_a_file_records_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    path = write(tmp_path / "lib", "plugin_file", "plugin-file")
    monkeypatch.chdir(tmp_path)
    cfg = fs.make_config(imports=["lib/plugin_file.py"], algorithm="plugin-file")
    assert cfg.imports == [str(path.resolve())]
    assert ALGORITHMS.origin("plugin-file") == "plugin_file.Method"
    # importing it again (another spelling of the same file) is a no-op
    assert plugins.import_modules([str(path), "lib/plugin_file.py"]) == [str(path.resolve())]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("no_such_module_xyz", ["cannot import 'no_such_module_xyz'", "current folder"]),
        ("missing.py", ["cannot import 'missing.py': no such file"]),
        ("empty_module", ["registered no algorithm, scenario or model"]),
        ("raises.py", ["importing 'raises.py' failed", "raises.py:2", "ZeroDivisionError"]),
        ("needs_dep", ["importing 'needs_dep' failed", "No module named 'not_installed_dep'"]),
        ("not a name", ["give a module name"]),
        ("json.py", ["another module of that name exists", "rename the file"]),
    ],
)
def test_bad_imports_are_one_sentence(tmp_path, monkeypatch, spec, words):
    (tmp_path / "empty_module.py").write_text("x = 1\n")
    (tmp_path / "raises.py").write_text("import fedshift\ny = 1 / 0\n")
    (tmp_path / "needs_dep.py").write_text("import not_installed_dep\n")
    (tmp_path / "json.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke("run", "--import", spec, *FAST, "--db", str(tmp_path / "r.db")), *words)
    with pytest.raises(FedshiftError):
        plugins.import_module(spec)


def test_an_unknown_algorithm_points_to_import():
    with pytest.raises(FedshiftError, match=r"--import MODULE \(docs/extending.md\)"):
        ALGORITHMS.get("entirely-unknown-method")


def test_rerunning_a_definition_replaces_it_another_module_is_refused():
    """A notebook cell run twice defines the class again under the same module and name:
    it replaces the first. Another module (or another class) taking the name is an error."""
    classes = []
    for _ in range(2):

        @register_algorithm("plugin-notebook")
        class Cell(FedAvg):
            pass

        classes.append(Cell)
    assert classes[0] is not classes[1] and ALGORITHMS.get("plugin-notebook") is classes[1]

    class Other(FedAvg):
        pass

    with pytest.raises(FedshiftError, match="already registered by .*Cell, so .*Other cannot"):
        register_algorithm("plugin-notebook")(Other)
    with pytest.raises(FedshiftError, match="'fedavg' is already registered by"):
        register_algorithm("fedavg")(Other)
    assert ALGORITHMS.get("fedavg") is FedAvg


def test_two_files_registering_one_name_are_refused(tmp_path):
    write(tmp_path, "plugin_one", "plugin-shared")
    write(tmp_path, "plugin_two", "plugin-shared")
    plugins.import_module(str(tmp_path / "plugin_one.py"))
    with pytest.raises(FedshiftError, match="plugin_one.Method, so plugin_two.Method cannot"):
        plugins.import_module(str(tmp_path / "plugin_two.py"))


def fake_distribution(site: Path, entry_points: str) -> None:
    """An installed package as importlib.metadata sees one: a dist-info folder with
    entry points, beside its module."""
    info = site / "fedshift_plugin_demo-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedshift-plugin-demo\n"
                                   "Version: 1.0\n")  # fmt: skip
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_entry_points_are_loaded_only_when_a_name_is_missing(tmp_path, monkeypatch):
    write(tmp_path, "plugin_installed", "plugin-ep")
    (tmp_path / "plugin_broken.py").write_text("raise ImportError('half installed')\n")
    fake_distribution(
        tmp_path,
        """
        [fedshift.algorithms]
        plugin-ep = plugin_installed:Method
        plugin-broken = plugin_broken
        plugin-liar = plugin_installed
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "plugin_installed" not in sys.modules
    ALGORITHMS.get("fedavg")  # a built-in name never looks at entry points
    assert "plugin_installed" not in sys.modules
    assert ALGORITHMS.get("plugin-ep").__module__ == "plugin_installed"
    assert ALGORITHMS.plugin("plugin-ep") == "fedshift-plugin-demo"
    with pytest.raises(FedshiftError, match="plugin-broken .* failed to load: ImportError"):
        ALGORITHMS.get("plugin-broken")
    with pytest.raises(FedshiftError, match="registered no algorithm 'plugin-liar'"):
        ALGORITHMS.get("plugin-liar")
    # a run through an entry point records no import: the package is found again
    out = fs.run(algorithm="plugin-ep", rounds=1, scenario_options={"clients": 3})
    assert out.config.imports == []


def test_fedshift_list_shows_installed_plugins(tmp_path, monkeypatch):
    (tmp_path / "plugin_scenario.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            from fedshift import opt, register_scenario, scenario

            @dataclass
            class Options:
                clients: int = opt(3, "number of clients")

            @register_scenario("plugin-digits", Options, "digits, from a plugin")
            def build(o, seed, data_dir):
                return scenario("digits-shortcut", seed=seed, clients=o.clients)
            """
        )
    )
    fake_distribution(tmp_path, "[fedshift.scenarios]\nplugin-digits = plugin_scenario\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    res = invoke("list", "scenarios", "--json")
    names = {s["name"]: s for s in json.loads(res.stdout)}
    assert names["plugin-digits"]["help"] == "digits, from a plugin"


def test_a_run_from_python_records_the_module_of_its_method(tmp_path, monkeypatch):
    write(tmp_path, "plugin_py", "plugin-py")
    monkeypatch.syspath_prepend(str(tmp_path))
    import plugin_py  # noqa: F401  (a notebook's `import`, no imports= given)

    out = fs.run(algorithm="plugin-py", rounds=1, scenario_options={"clients": 3})
    assert out.config.imports == ["plugin_py"]


def test_resume_imports_the_recorded_file_in_a_fresh_process(tmp_path, monkeypatch):
    from toy import power_cut_at

    path = write(tmp_path, "plugin_resume", "plugin-resume")
    db = tmp_path / "r.db"
    settings = dict(algorithm="plugin-resume", rounds=3, scenario_options={"clients": 3})
    with power_cut_at(monkeypatch, 1), pytest.raises(RuntimeError):
        fs.run(imports=[str(path)], db=db, checkpoint_every=1, **settings)
    run_id = RunStore(db).runs()[0]["run_id"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fedshift.cli", "run", "--resume", run_id, "--db", str(db)]
    res = subprocess.run([*cmd, "--json"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    resumed = json.loads(res.stdout.strip().splitlines()[-1])
    reference = fs.run(**settings)
    assert resumed["metrics"]["average"] == pytest.approx(reference.metrics["average"])
    # the file moved: one sentence saying what to do
    path.rename(tmp_path / "moved.py")
    RunStore(db).fail(run_id, "interrupted", "for the test")
    res = subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "needs the modules it was started with" in res.stderr
    assert "no such file" in res.stderr and "--import" in res.stderr


def test_sweep_imports_and_records_the_module(tmp_path, monkeypatch):
    write(tmp_path, "plugin_sweep", "plugin-sweep")
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "r.db"
    res = invoke("sweep", "--import", "plugin_sweep", "--set", "algorithm=plugin-sweep",
                 "--set", "scenario.clients=3", "--grid", "algorithm.beta=0.1,0.9",
                 "--rounds", "1", "--db", str(db), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    runs = RunStore(db).runs()
    assert len(runs) == 2 and all(r["config"]["imports"] == ["plugin_sweep"] for r in runs)
    for command in ("reproduce", "describe", "list"):
        assert "--import" in invoke(command, "--help").output
    assert "--import" in invoke("data", "export-partition", "--help").output
