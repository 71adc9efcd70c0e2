"""What an installed fedshift promises: ``--version``, type information (``py.typed``),
every third-party import declared in pyproject.toml, and ``import fedshift`` on Python
3.10 (``tomli`` standing in for ``tomllib``)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import fedshift
from fedshift.cli import app

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMPORT_NAMES = {
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "tomli_w": "tomli-w",
    "mlflow": "mlflow-skinny",
}
OPTIONAL = {"psutil"}  # imported under try/except ImportError, with a fallback


def declared() -> set[str]:
    project = PYPROJECT["project"]
    reqs = list(project["dependencies"])
    reqs += [r for extra in project["optional-dependencies"].values() for r in extra]
    names = set()
    for r in reqs:
        name = r.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            name = name.split(sep)[0]
        names.add(name.strip().lower())
    return names


def test_version_flag_prints_the_package_version():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"fedshift {fedshift.__version__}"
    assert PYPROJECT["project"]["version"] == fedshift.__version__


def test_the_package_ships_py_typed():
    assert (ROOT / "src" / "fedshift" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["fedshift"]


def test_every_third_party_import_is_declared():
    found = set()
    for path in (ROOT / "src" / "fedshift").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    third_party = found - set(sys.stdlib_module_names) - {"fedshift", "tomli"} - OPTIONAL
    missing = {IMPORT_NAMES.get(m, m).lower() for m in third_party} - declared()
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"
    assert "pandas" in declared() and "tomli-w" in declared()
    tomli = [r for r in PYPROJECT["project"]["dependencies"] if r.startswith("tomli")]
    assert tomli and "python_version < '3.11'" in tomli[0]


def test_import_and_toml_configs_work_without_tomllib():
    """As on Python 3.10: tomllib absent, tomli (the same parser) reads presets."""
    code = (
        "import sys; sys.modules['tomllib'] = None\n"
        "import fedshift, fedshift.config as c, fedshift.tables as r\n"
        "assert c.tomllib.__name__ == 'tomli'\n"
        "assert c.load_source('demo')['scenario'] == 'digits-shortcut'\n"
        "assert r.load_table('thesis-5.1-cmnist8').methods\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr


def test_an_unknown_preset_or_table_suggests_the_close_name(tmp_path):
    res = CliRunner().invoke(app, ["run", "mnist-iid-fedav", "--db", str(tmp_path / "r.db")])
    assert res.exit_code == 2 and "did you mean 'mnist-iid-fedavg'" in res.output
    res = CliRunner().invoke(app, ["reproduce", "thesis-5.1-cmnist", "--db", str(tmp_path / "r")])
    assert res.exit_code == 2 and "did you mean 'thesis-5.1-cmnist8'" in res.output


def test_benchmarks_and_examples_import_only_names_that_exist():
    """A module split (reproduce.py → tables.py, jobs.py …) must not leave a benchmark or
    an example importing a name from where it no longer is: the tests run neither."""
    import ast
    import importlib

    missing = []
    for path in sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("examples/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedshift"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    if not hasattr(module, alias.name) and importlib.util.find_spec(name) is None:
                        missing.append(f"{path.name}: {name}")
    assert missing == []
