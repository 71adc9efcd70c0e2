"""Client faults: injected ones (a lost, late or corrupted upload — the aberrant clients of
FedIPG §VI-A / SPEC §2.3) and numerical ones (an upload with NaN/Inf or an exploding norm).

Every decision is drawn from (run seed, round, client, "faults"), so it does not depend on
the cohort size or the visiting order, and a resumed run meets the same faults. The runner
applies them between ``client_update`` and ``aggregate`` and records one event per affected
client and round (``RoundRecord.extras["events"]``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..options import opt, require
from .rng import generator
from .tree import Tree, leaves


@dataclass(frozen=True)
class FaultOptions:
    clients: list[int] = opt(
        [], "ids of the aberrant clients the injected faults apply to ([] = every client)"
    )
    drop: float = opt(0.0, "probability that an aberrant client's upload is lost (unreliable)")
    delay: int = opt(0, "rounds an aberrant client's upload arrives late (slow client, τ)")
    corrupt: float = opt(0.0, "probability that an aberrant client's upload turns to NaN")
    max_norm: float = opt(
        0.0, "exclude an upload whose norm exceeds this many times the round's median (0 = off)"
    )

    def __post_init__(self) -> None:
        require(0.0 <= self.drop <= 1.0, f"faults.drop={self.drop} must lie in [0, 1]")
        require(0.0 <= self.corrupt <= 1.0, f"faults.corrupt={self.corrupt} must lie in [0, 1]")
        require(self.delay >= 0, f"faults.delay={self.delay} must be >= 0 rounds")
        require(self.max_norm >= 0, f"faults.max_norm={self.max_norm} must be >= 0 (0 = off)")
        require(
            all(int(c) >= 0 for c in self.clients),
            f"faults.clients={list(self.clients)} must list client ids >= 0",
        )

    @property
    def injects(self) -> bool:
        return self.drop > 0 or self.delay > 0 or self.corrupt > 0


def injected_fault(opts: FaultOptions, seed: int, round_: int, client: int) -> str | None:
    """What happens to this client's upload this round: None, "dropped", "delayed" or
    "corrupted" (seeded; only aberrant clients are affected)."""
    if not opts.injects or (opts.clients and client not in opts.clients):
        return None
    u = generator(seed, round_, client, "faults").random(2)
    if u[0] < opts.drop:
        return "dropped"
    if u[1] < opts.corrupt:
        return "corrupted"
    if opts.delay > 0:
        return "delayed"
    return None


def corrupt(upload: Tree, row: int) -> None:
    """Replace one client's row of every floating upload tensor by NaN (in place)."""
    for v in leaves(upload):
        if v.is_floating_point():
            v[row] = float("nan")


def row_norms(upload: Tree) -> Tensor:
    """[P] L2 norm of each participant's floating upload tensors together."""
    rows = [v.detach().reshape(v.shape[0], -1) for v in leaves(upload) if v.is_floating_point()]
    if not rows:
        return torch.zeros(0)
    # in float32 (no converted copy of the uploads), one host sync for every tensor; a row
    # whose float32 norm overflows is measured again in float64, so a huge but finite upload
    # is never called non-finite
    device = rows[0].device  # uploads may mix devices
    norms = torch.stack([torch.linalg.vector_norm(r, dim=1).to(device) for r in rows]).double()
    overflowed = ~torch.isfinite(norms)
    if bool(overflowed.any()):
        for t, i in overflowed.nonzero().tolist():
            norms[t, i] = torch.linalg.vector_norm(rows[t][i], dtype=torch.float64)
    squares = norms.square()
    total = squares[0]
    for sq in squares[1:]:  # tensor by tensor, in the uploads' order
        total = total + sq
    return total.sqrt().cpu()


def screen(upload: Tree, opts: FaultOptions) -> list[str | None]:
    """Per participant: None when its upload is usable, else why not ("nonfinite" or
    "norm"). A norm is exploding when it exceeds ``max_norm`` × the median of the finite
    norms of the round."""
    norms = row_norms(upload)
    if norms.numel() == 0:
        return []
    ok = torch.isfinite(norms)  # one call for the round (not one per participant)
    verdict: list[str | None] = [None if o else "nonfinite" for o in ok.tolist()]
    finite = norms[ok]
    if opts.max_norm > 0 and finite.numel() > 0:
        limit = opts.max_norm * float(finite.median())
        over = [n > limit for n in norms.tolist()]
        verdict = [v or ("norm" if o else None) for v, o in zip(verdict, over, strict=True)]
    return verdict


def finite_rows(*tensors: Tensor) -> Tensor:
    """[n] whether row i of every tensor (each [n, …]) is all finite. A row's sum carries
    any NaN or ±inf in one pass (``isfinite(v).all(1)`` writes and reads a boolean copy: 4.6
    against 0.15 ms for 8 rows of 153k on the development CPU), and the sums of every tensor
    are checked with one host sync; a finite row whose sum overflows is then checked entry
    by entry, so the answer is exact."""
    rows = [v.reshape(v.shape[0], -1) for v in tensors]
    device = rows[0].device
    ok = torch.isfinite(torch.stack([r.sum(1).to(device, torch.float64) for r in rows])).all(0)
    if not bool(ok.all()):
        ok = torch.stack([_finite_rows_exact(r).to(device) for r in rows]).all(0)
    return ok


def _finite_rows_exact(rows: Tensor) -> Tensor:
    ok = torch.isfinite(rows.sum(1))
    for i in (~ok).nonzero().flatten().tolist():
        ok[i] = bool(torch.isfinite(rows[i]).all())
    return ok


def finite(tree: Tree) -> bool:
    tensors = [v.reshape(1, -1) for v in leaves(tree) if v.is_floating_point()]
    return not tensors or bool(finite_rows(*tensors)[0])
