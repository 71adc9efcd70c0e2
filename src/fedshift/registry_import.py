"""Import every module of a package, so that adding a method or scenario is adding a file."""

from __future__ import annotations

import importlib
import pkgutil


def import_submodules(package_name: str, package_path: list[str]) -> None:
    for info in sorted(pkgutil.iter_modules(package_path), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package_name}.{info.name}")
