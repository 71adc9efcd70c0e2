"""Atomic checkpoints of a run: server state, every client's persistent state, the rounds
done and their records, and the final evaluation once the last round is done. Randomness
is derived from (seed, round, client, purpose), so this is all a resumed run needs to
continue exactly as the uninterrupted run would have.

A checkpoint holds tensors and plain values (dict, list, tuple, str, int, float, bool,
None) only and is read with ``torch.load(weights_only=True)``: a file carrying any other
pickled object is refused, never unpickled, so a checkpoint cannot run code. It names the
run it belongs to (run id, hash of the run's config, rounds done), so another run's
checkpoint, or an impossible one, is refused before it is used."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..errors import FedshiftError

FORMAT = "fedshift-checkpoint/2"  # absent in checkpoints of older versions (not bound to a run)
REQUIRED = ("rounds_done", "server", "clients", "records", "time_s", "bytes_up", "bytes_down")


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of a run's config as the run store keeps it (JSON), so the hash written at
    the start equals the one a resume recomputes from the store."""
    canonical = json.dumps(json.loads(json.dumps(config)), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def plain(value: Any) -> Any:
    """``value`` as tensors and builtin values only, the types a weights-only load accepts
    (numpy scalars become Python numbers); anything else is a bug, refused at save."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(plain(v) for v in value)
    if isinstance(value, (list, tuple)):  # named tuples become lists
        return [plain(v) for v in value]
    for kind in (bool, int, float, str):  # subclasses such as numpy.float64
        if isinstance(value, kind):
            return kind(value)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    raise TypeError(f"a checkpoint holds tensors and plain values only, not {type(value)!r}")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: temp file in the same folder, fsync, rename."""
    path = Path(path)
    payload = plain({**state, "format": FORMAT})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint without unpickling anything but tensors and plain values."""
    try:
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise FedshiftError(f"checkpoint {str(path)!r} does not exist") from None
    except pickle.UnpicklingError:
        raise FedshiftError(
            f"checkpoint {str(path)!r} holds Python objects other than tensors and plain "
            "values, which could run code when loaded, so it is refused (was it written by "
            "another program?)"
        ) from None
    except Exception as e:  # a truncated or foreign file
        raise FedshiftError(f"checkpoint {str(path)!r} cannot be read ({e})") from None
    if not isinstance(state, dict) or not all(k in state for k in REQUIRED):
        raise FedshiftError(f"{str(path)!r} is not a fedshift checkpoint")
    return state


def check_binding(
    state: dict[str, Any],
    path: str | Path,
    run_id: str,
    config_digest: str,
    rounds: int,
    earlier: tuple[str, ...] = (),
) -> None:
    """Refuse a checkpoint of another run, of another config, or of an impossible round,
    before any of it is used. ``earlier`` are hashes of configs the run had before a
    change on resume that took effect at this checkpoint's round (the checkpoint was
    written before the change). Checkpoints of older versions carry no binding: only
    their round is checked (their server state is checked against the model on load)."""
    where = f"checkpoint {str(path)!r}"
    if state.get("format") == FORMAT:
        if state.get("run_id") != run_id:
            raise FedshiftError(
                f"{where} belongs to run {state.get('run_id')!r}, not to run {run_id!r}; "
                "it cannot continue this run"
            )
        if state.get("config_hash") not in (config_digest, *earlier):
            raise FedshiftError(
                f"{where} was written for another config (hash "
                f"{str(state.get('config_hash'))[:12]}…, run {run_id!r} has "
                f"{config_digest[:12]}…); it cannot continue this run"
            )
    elif "format" in state:
        raise FedshiftError(f"{where} has an unknown format {state['format']!r}")
    done = state["rounds_done"]
    if type(done) is not int or not 1 <= done <= rounds:
        raise FedshiftError(
            f"{where} says {done!r} rounds were done, but run {run_id!r} has {rounds} rounds "
            f"(expected 1 to {rounds}); it cannot continue this run"
        )
    if not isinstance(state["records"], list) or len(state["records"]) != done:
        raise FedshiftError(
            f"{where} is damaged: it says {done} rounds were done but holds the records of "
            f"{len(state['records']) if isinstance(state['records'], list) else 'no'} rounds"
        )
