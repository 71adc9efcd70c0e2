"""docs/extending.md runs as written: its ``python`` blocks (files marked ``# file: NAME.py``
are saved, the others executed in order as one notebook would), its ``bash`` lines (each a
``fedshift`` command) and its ``toml`` blocks (parsed), in an empty folder."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedshift import plugins
from fedshift.algorithms import ALGORITHMS
from fedshift.cli import app
from fedshift.data import SCENARIOS
from fedshift.models import MODELS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(path: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(path.read_text())]


def commands(bash: str) -> list[str]:
    lines = bash.replace("\\\n", " ").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty folder as the working directory; what the doc registers or imports is
    forgotten afterwards."""
    regs = [ALGORITHMS, SCENARIOS, MODELS]
    saved = [(dict(r._items), dict(r._origins), dict(r._plugins)) for r in regs]
    imported, modules = dict(plugins._imported), set(sys.modules)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for r, (items, origins, plugs) in zip(regs, saved, strict=True):
        r._items, r._origins, r._plugins = items, origins, plugs
    plugins._imported.clear()
    plugins._imported.update(imported)
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def test_the_doc_has_the_blocks_this_test_runs():
    kinds = [k for k, _ in blocks(DOC)]
    files = [b for k, b in blocks(DOC) if k == "python" and b.startswith("# file: ")]
    assert kinds.count("python") >= 5 and kinds.count("bash") >= 2 and "toml" in kinds
    assert len(files) == 2
    assert all(k in ("python", "bash", "toml") for k in kinds), kinds  # nothing skipped


def test_every_block_of_extending_md_runs(isolated, capsys):
    namespace = {"__name__": "__main__"}  # as in a notebook
    ran = 0
    for kind, body in blocks(DOC):
        if kind == "toml":
            tomllib.loads(body)
        elif kind == "python" and body.startswith("# file: "):
            name = body.splitlines()[0].removeprefix("# file: ").strip()
            (isolated / name).write_text(body)
        elif kind == "python":
            exec(compile(body, f"{DOC.name}:python", "exec"), namespace)
        else:
            for line in commands(body):
                args = shlex.split(line)
                assert args[0] == "fedshift", line
                res = CliRunner().invoke(app, args[1:])
                assert res.exit_code == 0, f"{line}\n{res.output}"
        ran += 1
    assert ran == len(blocks(DOC))
    assert "already registered" in capsys.readouterr().out
