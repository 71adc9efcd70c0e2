"""Atomic checkpoints of a run: server state, every client's persistent state, the rounds
done and their records. Randomness is derived from (seed, round, client, purpose), so
this is all a resumed run needs to continue exactly as the uninterrupted run would have."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..errors import FedshiftError


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: temp file in the same folder, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    try:
        return torch.load(Path(path), map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise FedshiftError(f"checkpoint {str(path)!r} does not exist") from None
    except Exception as e:  # a truncated or foreign file
        raise FedshiftError(f"checkpoint {str(path)!r} cannot be read ({e})") from None
