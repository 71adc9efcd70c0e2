"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing
page or a docstring mkdocstrings cannot render fails the build), and every user page of
docs/ is in its navigation. Needs the ``docs`` extra; skipped without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def nav_pages(nav) -> set[str]:
    """Every page file named in mkdocs.yml's ``nav`` (nested sections included)."""
    out: set[str] = set()
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            out |= nav_pages(value) if isinstance(value, list) else {value}
    return out


def test_every_user_page_is_in_the_navigation():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = ROOT / config["docs_dir"]
    pages = {p.relative_to(docs).as_posix() for p in docs.glob("*.md")}
    pages |= {p.relative_to(docs).as_posix() for p in (docs / "methods").glob("*.md")}
    listed = nav_pages(config["nav"])
    assert pages - listed == set(), "add these pages to mkdocs.yml's nav"
    assert listed - pages == set(), "mkdocs.yml's nav names pages that do not exist"


def test_the_site_builds_in_strict_mode(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    site = tmp_path / "site"
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    api = (site / "api" / "index.html").read_text()
    for name in ("register_algorithm", "from_clients", "FederatedData", "read_partition"):
        assert name in api, name
    assert (site / "extending" / "index.html").is_file()
    assert (site / "partitions" / "index.html").is_file()
