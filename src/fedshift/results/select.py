"""Choosing and telling apart stored runs: ``fedshift runs --where key=value`` and the
config keys whose values differ among the listed runs (the columns that tell the eight
runs of a sweep apart).

The store keeps each config value as it was given (``--set lr=0.01`` records the string
``"0.01"``, a TOML file the number); values are compared by what they mean
(:func:`fedshift.config.canonical`).
"""

from __future__ import annotations

import json
from typing import Any

from ..config import ALIASES, canonical
from ..errors import FedshiftError, did_you_mean

RUN_FIELDS = ("status",)  # filterable columns of a run that are no config key


def _key(value: Any) -> str:
    return json.dumps(canonical(value), sort_keys=True, default=str)


def run_value(run: dict, key: str, missing: Any = None) -> Any:
    if key in RUN_FIELDS:
        return run.get(key, missing)
    return (run.get("config") or {}).get(ALIASES.get(key, key), missing)


def parse_where(items: list[str], runs: list[dict]) -> list[tuple[str, str]]:
    """``key=value`` conditions; a key that no stored run has is an error naming the keys."""
    known = set(RUN_FIELDS) | {k for r in runs for k in (r.get("config") or {})}
    conditions = []
    for item in items:
        key, eq, value = item.partition("=")
        key = ALIASES.get(key.strip(), key.strip())
        if not eq or not key:
            raise FedshiftError(f"--where {item!r} is not of the form key=value")
        if runs and key not in known:
            raise FedshiftError(
                f"--where key {key!r} is in no stored run's config{did_you_mean(key, known)}; "
                f"keys: {', '.join(sorted(known))}"
            )
        conditions.append((key, value.strip()))
    return conditions


def matches(run: dict, conditions: list[tuple[str, str]]) -> bool:
    missing = object()
    for key, value in conditions:
        stored = run_value(run, key, missing)
        if stored is missing or _key(stored) != _key(value):
            return False
    return True


def varying_keys(runs: list[dict], skip: tuple[str, ...] = ()) -> list[str]:
    """Config keys whose value differs among ``runs`` (absent counts as a value), in the
    order they first appear; ``skip`` names keys the caller shows anyway."""
    keys: dict[str, None] = {}
    for r in runs:
        keys.update(dict.fromkeys(r.get("config") or {}))
    missing = object()
    out = []
    for k in keys:
        if k in skip:
            continue
        values = {
            "<absent>" if (v := run_value(r, k, missing)) is missing else _key(v) for r in runs
        }
        if len(values) > 1:
            out.append(k)
    return out
