"""The scripts in examples/ run as a user runs them (a fresh Python, the repository's source),
at smoke-test scale (FEDSHIFT_EXAMPLE_SMALL=1: seconds each), and write what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedshift.results.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, out: Path, data_dir: Path | None = None) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "FEDSHIFT_EXAMPLE_SMALL": "1",
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }
    if data_dir is not None:
        env["FEDSHIFT_DATA"] = str(data_dir)
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--out", str(out)],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def stored_runs(db: Path) -> list[tuple[str, str]]:
    """(algorithm, status) of every run in the store, sorted."""
    return sorted((r["algorithm"], r["status"]) for r in RunStore(db).runs())


def test_every_example_is_tested():
    assert {p.name for p in EXAMPLES.glob("*.py")} == {
        "quickstart.py",
        "shortcut_story.py",
        "own_method.py",
    }


def test_quickstart(tmp_path):
    out = run_example("quickstart.py", tmp_path / "quick")
    assert "fedavg" in out and "fedprox" in out and "p=0.0" in out
    assert stored_runs(tmp_path / "quick" / "runs.db") == [("fedavg", "done"), ("fedprox", "done")]


def test_own_method(tmp_path):
    out = run_example("own_method.py", tmp_path / "own")
    assert "FedNTD with β = 0 gives FedAvg's accuracies" in out
    assert stored_runs(tmp_path / "own" / "runs.db") == [("fedavg", "done"), ("fedntd", "done")]


def test_shortcut_story(tmp_path, shared_datasets):
    out = run_example("shortcut_story.py", tmp_path / "story", shared_datasets)
    assert "ERM (FedAvg)" in out and "IRM" in out and "oracle (grayscale)" in out
    plot = tmp_path / "story" / "accuracy_per_env.png"
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
    runs = stored_runs(tmp_path / "story" / "runs.db")
    assert runs == [("fedavg", "done"), ("fedavg", "done"), ("irm", "done")]


@pytest.mark.parametrize("name", ["quickstart.py", "shortcut_story.py", "own_method.py"])
def test_examples_explain_themselves(name):
    text = (EXAMPLES / name).read_text()
    assert text.startswith('"""') and "FEDSHIFT_EXAMPLE_SMALL" in text
    assert f"python examples/{name}" in text  # how to run it, in its docstring


def test_the_cli_imports_the_method_of_own_method_py(tmp_path):
    """Importing the example runs no experiment (main is guarded), so --import takes it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "fedshift.cli", "run", "--import", "examples/own_method.py"]
    cmd += ["--set", "algorithm=fedntd", "--set", "scenario.clients=3", "--rounds", "1"]
    res = subprocess.run([*cmd, "--db", str(tmp_path / "r.db")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert stored_runs(tmp_path / "r.db") == [("fedntd", "done")]
