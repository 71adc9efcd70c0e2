"""Typed option dataclasses shared by algorithms, scenarios and models.

Each option is a dataclass field made with :func:`opt` (default + one help line). Values
arrive from the CLI as strings (``--set scenario.alpha=0.1``) or from TOML as native
values; :func:`build_options` converts them by the field's annotation and names the bad
key or value in one sentence when something is wrong.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import types
import typing
from typing import Any

from .errors import FedshiftError, did_you_mean

# Work-size bounds, checked while the config is read (before anything is built or
# recorded): a count above MAX_COUNT (rounds, epochs, steps, widths, clients …) is a typo or
# a fuzzer, not an experiment, and would hang or exhaust memory; a number beyond float32's
# range cannot reach the tensors it is meant for. Seeds may be any 64-bit value.
MAX_COUNT = 10**7
MAX_SEED = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38


def opt(default: Any, help: str, choices: tuple | None = None) -> Any:
    """A dataclass field carrying a default, a help line and optional allowed values."""
    kw: dict[str, Any] = {"metadata": {"help": help, "choices": choices}}
    if isinstance(default, (list, dict, set)):
        kw["default_factory"] = lambda d=default: type(d)(d)
    else:
        kw["default"] = default
    return dataclasses.field(**kw)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _convert(key: str, tp: Any, raw: Any) -> Any:
    """Convert ``raw`` (a string from the CLI or a TOML value) to the annotated type."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and (
            raw is None or (isinstance(raw, str) and raw.lower() in ("none", "null", ""))
        ):
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(key, a, raw)
            except FedshiftError as e:
                errors.append(str(e))
        raise FedshiftError(f"{key}={raw!r} is not a valid {_type_name(tp)}")
    if origin in (list, tuple):
        (inner, *_rest) = [a for a in typing.get_args(tp) if a is not Ellipsis] or [str]
        if isinstance(raw, str):
            text = raw.strip()
            try:
                val = ast.literal_eval(text) if text.startswith(("[", "(")) else text.split(",")
            except (ValueError, SyntaxError):
                raise FedshiftError(f"{key}={raw!r} is not a list (write e.g. [0.9,0.8])") from None
            raw = val
        if not isinstance(raw, (list, tuple)):
            raw = [raw]
        out = [_convert(key, inner, v) for v in raw]
        return tuple(out) if origin is tuple else out
    if tp is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(raw, str) and raw.lower() in ("false", "0", "no", "off"):
            return False
        raise FedshiftError(f"{key}={raw!r} is not a boolean (use true or false)")
    if tp is int:
        if isinstance(raw, bool):
            raise FedshiftError(f"{key}={raw!r} is not an integer")
        try:
            f = float(raw)
        except (TypeError, ValueError, OverflowError):
            raise FedshiftError(f"{key}={raw!r} is not an integer") from None
        if not math.isfinite(f) or f != int(f):
            raise FedshiftError(f"{key}={raw!r} is not an integer")
        exact = isinstance(raw, str) and raw.strip().lstrip("-").isdigit()
        value = int(raw) if isinstance(raw, int) or exact else int(f)
        bound = MAX_SEED if key.endswith("seed") else MAX_COUNT
        if abs(value) > bound:
            raise FedshiftError(
                f"{key}={raw!r} is larger than fedshift accepts (at most {bound:,}"
                + (": a count this large would not finish" if bound == MAX_COUNT else "")
                + ")"
            )
        return value
    if tp is float:
        if isinstance(raw, bool):
            raise FedshiftError(f"{key}={raw!r} is not a number")
        try:
            f = float(raw)
        except (TypeError, ValueError, OverflowError):
            raise FedshiftError(f"{key}={raw!r} is not a number") from None
        if not math.isfinite(f):
            raise FedshiftError(f"{key}={raw!r} is not a finite number")
        if abs(f) > FLOAT32_MAX:
            raise FedshiftError(
                f"{key}={raw!r} is beyond the range of the float32 tensors it is used in "
                "(at most 3.4e38 in magnitude)"
            )
        return f
    if tp is str:
        if not isinstance(raw, (str, int, float)):
            raise FedshiftError(f"{key}={raw!r} is not a string")
        return str(raw)
    return raw


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def build_options(cls: type, values: dict[str, Any], prefix: str) -> Any:
    """Instantiate options dataclass ``cls`` from ``values`` (keys without ``prefix``).

    Unknown keys, unconvertible values and values outside ``choices`` raise
    :class:`FedshiftError` naming the key and what is allowed.
    """
    hints = typing.get_type_hints(cls)
    fields = _fields(cls)
    kwargs = {}
    for key, raw in values.items():
        full = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            allowed = ", ".join(f"{prefix}.{k}" for k in fields) or "none"
            hint = did_you_mean(key, fields)
            raise FedshiftError(f"unknown option {full!r}{hint}; allowed: {allowed}")
        val = _convert(full, hints[key], raw)
        choices = fields[key].metadata.get("choices")
        if choices is not None and val not in choices:
            raise FedshiftError(
                f"{full}={raw!r} is not allowed; choose one of: {', '.join(map(str, choices))}"
            )
        kwargs[key] = val
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        if isinstance(e, FedshiftError):
            raise
        raise FedshiftError(f"{prefix or 'options'}: {e}") from None


def describe_options(cls: type) -> list[dict[str, Any]]:
    """Name, type, default, help and choices of each option (for `fedshift list`)."""
    hints = typing.get_type_hints(cls)
    out = []
    for name, f in _fields(cls).items():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append(
            {
                "name": name,
                "type": _type_name(hints[name]),
                "default": list(default) if isinstance(default, tuple) else default,
                "help": f.metadata.get("help", ""),
                "choices": list(f.metadata["choices"]) if f.metadata.get("choices") else None,
            }
        )
    return out


def require(cond: bool, message: str) -> None:
    """Raise a one-sentence :class:`FedshiftError` when an option constraint fails."""
    if not cond:
        raise FedshiftError(message)
