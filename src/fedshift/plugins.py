"""A user's own algorithms, scenarios and models, brought in by importing their module.

``fedshift run --import mymethod --set algorithm=mine`` (or ``imports = ["mymethod"]`` in a
config) imports ``mymethod`` — a module name found in the current folder or on the Python
path, or a path to a ``.py`` file — whose ``@register_algorithm`` / ``@register_scenario`` /
``@register_model`` decorators register its names. A run records what it imported (module
names as given, files as absolute paths) in its stored config, so ``--resume`` imports the
same modules again. Installed packages use entry points instead (see
:mod:`fedshift.registry`); both are described in ``docs/extending.md``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from .errors import FedshiftError

_imported: dict[str, str] = {}  # spec as recorded → module name, for idempotent imports


def _registries() -> dict:
    from .algorithms import ALGORITHMS
    from .data import SCENARIOS
    from .models import MODELS

    return {"algorithm": ALGORITHMS, "scenario": SCENARIOS, "model": MODELS}


def _registered() -> dict[tuple[str, str], str | None]:
    return {(k, n): r.origin(n) for k, r in _registries().items() for n in list(r._items)}


def _defines(module: str) -> bool:
    """Whether something registered comes from ``module`` (or a submodule of it)."""
    return any(o is not None and (o.startswith(module + ".")) for o in _registered().values())


def is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def import_module(spec: str) -> str:
    """Import a user's module once; return the spec a run records (a module name as given,
    a file as its absolute path). One sentence when the module is missing, fails to import
    or registers nothing."""
    spec = str(spec).strip()
    key = str(Path(spec).expanduser().resolve()) if is_file_spec(spec) else spec
    if key in _imported:
        return key
    if not is_file_spec(spec) and not all(p.isidentifier() for p in spec.split(".")):
        raise FedshiftError(
            f"cannot import {spec!r}: give a module name (mymethod, mypackage.methods) or a "
            "path to a .py file"
        )
    before = _registered()  # after fedshift's own registries are filled
    module = _import_file(spec, Path(key)) if is_file_spec(spec) else _import_name(spec)
    if _registered() == before and not _defines(module.__name__):
        raise FedshiftError(
            f"module {spec!r} registered no algorithm, scenario or model; decorate its class "
            "with @register_algorithm(NAME), or its builder with @register_scenario / "
            "@register_model (docs/extending.md)"
        )
    _imported[key] = module.__name__
    return key


def import_modules(specs: Iterable[str] | None) -> list[str]:
    """:func:`import_module` for each spec, in order; the specs a run records."""
    out: list[str] = []
    for spec in [specs] if isinstance(specs, str) else specs or []:
        key = import_module(spec)
        if key not in out:
            out.append(key)
    return out


def imported_already(spec: str) -> bool:
    """Whether the module a recorded spec names is loaded and registers something (given
    again with ``--import`` from elsewhere, say, after the file moved)."""
    name = Path(spec).stem if is_file_spec(spec) else spec
    return name in sys.modules and _defines(name)


def user_modules(names: dict[str, str]) -> list[str]:
    """Modules (outside fedshift) that define the registered names a run uses, ``{kind:
    name}``, so a run started from Python records them too. Skipped: ``__main__`` (a
    script or notebook, not importable again), installed plugins (found by their entry
    points) and modules already imported by spec."""
    regs = _registries()
    covered = set(_imported.values())
    out = []
    for kind, name in names.items():
        registry = regs[kind]
        origin = registry.origin(name) if name in registry._items else None
        if origin is None or registry.plugin(name):
            continue
        module = _module_of(origin)
        if module.split(".")[0] in ("fedshift", "__main__") or module in covered:
            continue
        if module not in out:
            out.append(module)
    return out


def _module_of(origin: str) -> str:
    """The module part of ``module.QualName``: the longest prefix that is a loaded module."""
    parts = origin.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:i]) in sys.modules:
            return ".".join(parts[:i])
    return parts[0]


@contextlib.contextmanager
def _on_path(folder: str):
    """``folder`` first on ``sys.path`` while a module imports (its siblings with it)."""
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def _import_name(name: str) -> ModuleType:
    cwd = os.getcwd()
    with _on_path(cwd):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                raise FedshiftError(
                    f"cannot import {name!r}: no module of that name in the current folder "
                    f"({cwd}) or on the Python path; give its name from the folder that holds "
                    "it, or a path to the .py file"
                ) from None
            raise _failed(name, e) from e
        except FedshiftError:
            raise
        except Exception as e:
            raise _failed(name, e) from e


def _import_file(spec: str, path: Path) -> ModuleType:
    if not path.is_file():
        raise FedshiftError(f"cannot import {spec!r}: no such file")
    name = path.stem
    if path.suffix != ".py" or not name.isidentifier():
        raise FedshiftError(
            f"cannot import {spec!r}: a file to import must be NAME.py with NAME a valid "
            "Python module name"
        )
    clash = sys.modules.get(name)
    if clash is None:
        with contextlib.suppress(ImportError, ValueError):
            clash = importlib.util.find_spec(name)
    if clash is not None:
        where = getattr(clash, "__file__", None) or getattr(clash, "origin", None)
        if where and Path(where).resolve() == path:
            if name in sys.modules:
                return sys.modules[name]
        else:
            raise FedshiftError(
                f"cannot import {spec!r} as module {name!r}: another module of that name "
                f"exists ({where or 'built in'}); rename the file"
            )
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # before running it: dataclasses look their module up
    with _on_path(str(path.parent)):
        try:
            loader_spec.loader.exec_module(module)
        except BaseException as e:
            sys.modules.pop(name, None)
            if isinstance(e, FedshiftError):
                raise
            if not isinstance(e, Exception):
                raise
            raise _failed(spec, e) from e
    return module


def _failed(spec: str, e: Exception) -> FedshiftError:
    """One sentence for a module that raised while importing, with the line that raised."""
    ours = str(Path(__file__).parent)
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if not f.filename.startswith((ours, "<frozen"))]
    at = f" ({mine[-1].filename}:{mine[-1].lineno})" if mine else ""
    if isinstance(e, SyntaxError):
        at = f" ({e.filename}:{e.lineno})"
    return FedshiftError(f"importing {spec!r} failed{at}: {type(e).__name__}: {e}")
