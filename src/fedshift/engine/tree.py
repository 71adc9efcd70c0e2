"""Helpers over state trees: mappings of names to tensors or to further such mappings,
optionally stacked with a leading client axis.

Every piece of per-client and server state in fedshift is such a tree: FedAvg's server is
``{"p": params, "b": buffers}``, pFedMe's client state ``{"pm": personal params}``. The
engine stacks, slices, averages, checkpoints, counts and sends trees without knowing their
shape. Where a flat mapping is needed (a checkpoint file, a Flower ``ArrayRecord``)
:func:`flatten` joins the names of a path with ``/`` (``"p/fc1.weight"``) and
:func:`unflatten` takes it apart again; model parameter names never contain ``/``. Empty
sub-trees have no leaves, so a flatten drops them; the engine puts them back from the
method's own template when it restores a state (:func:`empty_parts_like`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Union

import torch
from torch import Tensor

Tree = dict[str, Union[Tensor, "Tree"]]
SEP = "/"


def is_nested(tree: Mapping) -> bool:
    """Whether any value of ``tree`` is itself a mapping."""
    return any(isinstance(v, Mapping) for v in tree.values())


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Tensor]:
    """``{"p": {"w": t}}`` → ``{"p/w": t}`` (a flat tree comes back as a new dict of the
    same items)."""
    out: dict[str, Tensor] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}{SEP}"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def unflatten(flat: Mapping[str, Tensor]) -> Tree:
    """The inverse of :func:`flatten`: every ``/`` in a name opens a level."""
    out: Tree = {}
    for k, v in flat.items():
        *path, leaf = k.split(SEP)
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = v
    return out


def empty_parts_like(tree: Tree, like: Mapping) -> Tree:
    """``tree`` with the empty sub-trees of ``like`` put back where ``tree`` lacks them
    (what :func:`unflatten` of a saved state cannot know: a model without buffers keeps
    its ``"b": {}``)."""
    for k, v in like.items():
        if isinstance(v, Mapping):
            if k not in tree and not flatten(v):  # empty, or sub-trees that are all empty
                tree[k] = tree_map(lambda t: t, v)
            elif isinstance(tree.get(k), Mapping):
                empty_parts_like(tree[k], v)
    return tree


def leaves(tree: Mapping) -> Iterator[Tensor]:
    for v in tree.values():
        if isinstance(v, Mapping):
            yield from leaves(v)
        else:
            yield v


def tree_map(fn: Callable[..., Tensor], tree: Mapping, *rest: Mapping) -> Tree:
    """``fn`` applied to every tensor of ``tree`` (with the tensors of the same names in
    ``rest``: ``fn(a, b, …)``), the structure of ``tree`` kept. A sub-tree of ``tree``
    that ``rest`` lacks is looked up as empty (an empty part, e.g. no buffers, is not sent)."""
    return {
        k: tree_map(fn, v, *(r.get(k, {}) for r in rest))
        if isinstance(v, Mapping)
        else fn(v, *(r[k] for r in rest))
        for k, v in tree.items()
    }


def to_device(tree: Mapping, device: torch.device | str) -> Tree:
    """Every tensor of ``tree`` on ``device`` (the same tensor where it is there already).
    What algorithms create on the CPU (a round counter, DRO weights, per-client α) joins
    the cohort's device, so their arithmetic never mixes devices. On MPS, which has no
    float64, float64 tensors stay where they are."""
    device = torch.device(device)

    def move(v: Tensor) -> Tensor:
        if device.type == "mps" and v.dtype == torch.float64:
            return v
        return v.to(device)

    return tree_map(move, tree)


def stack(tree: Mapping, n: int, copy: bool = True) -> Tree:
    """Repeat a single-client tree ``n`` times along a new leading client axis.

    ``copy=False`` gives read-only views of the one tree (no memory per client), for
    models handed straight to ``Context.train``, which copies what it trains: a cohort's
    stacked copy less at the round's peak (133 MB for W2's 20 CNNs, 0.9 GB for W5's
    ResNet-18s). Writing into such a view raises."""

    def repeat(v: Tensor) -> Tensor:
        view = v.detach().unsqueeze(0).expand(n, *v.shape)
        return view.clone() if copy else view

    return tree_map(repeat, tree)


def take(tree: Mapping, index: Tensor | slice | int) -> Tree:
    """Rows ``index`` of every stacked tensor (a copy for tensor indices, a view for slices
    and single rows)."""
    return tree_map(lambda v: v[index], tree)


def put(tree: Mapping, index: Tensor, rows: Mapping) -> None:
    """Write ``rows`` back into the stacked ``tree`` at ``index`` (in place)."""
    for k, v in rows.items():
        if isinstance(v, Mapping):
            if k in tree or flatten(v):  # an empty part (no buffers) has nothing to write
                put(tree[k], index, v)
        else:
            tree[k][index.to(tree[k].device)] = v.to(tree[k].device, tree[k].dtype)


def concat(trees: list[Mapping]) -> Tree:
    """Concatenate stacked trees along the client axis (chunks of one round); a single
    tree comes back as it is, not copied (a ResNet cohort's copy is a second of memory
    traffic), so a caller that changes the result in place copies first."""
    if not trees:
        return {}
    if len(trees) == 1:
        return dict(trees[0])
    parts = {k: [t[k] for t in trees] for k in trees[0]}
    return {k: concat(p) if isinstance(p[0], Mapping) else torch.cat(p) for k, p in parts.items()}


def _write_rows(dst: Mapping, src: Mapping, rows: slice) -> None:
    for k, v in src.items():
        if isinstance(v, Mapping):
            _write_rows(dst[k], v, rows)
        else:
            dst[k][rows] = v


class Rows:
    """The chunks of one round stacked into a tree of ``total`` rows as they arrive: each
    chunk is copied into a tree allocated once and can be freed at once, so the round's
    uploads are held once (``concat`` of a kept list holds them twice: at 10,000 MNIST
    clients the peak fell from 6.9 to 4.3 GB). A round of one chunk is kept as it is."""

    def __init__(self, total: int):
        self.total, self.filled, self.tree = total, 0, None

    def add(self, chunk: Mapping, n: int) -> None:
        """Append the ``n`` rows of ``chunk`` (an empty tree: a method that uploads nothing)."""
        if self.tree is None:
            if n == self.total:  # the whole round in one chunk
                self.tree, self.filled = dict(chunk), n
                return
            self.tree = tree_map(lambda v: v.new_empty((self.total, *v.shape[1:])), chunk)
        with torch.no_grad():
            _write_rows(self.tree, chunk, slice(self.filled, self.filled + n))
        self.filled += n

    def result(self) -> Tree:
        if self.filled != self.total:
            raise ValueError(f"{self.filled} of {self.total} rows were added")
        return self.tree or {}


def select(tree: Mapping[str, Tensor], keep: Callable[[str], bool]) -> Tree:
    """The entries of a flat tree whose names ``keep`` accepts (a model's head by its
    module name)."""
    return {k: v for k, v in tree.items() if keep(k)}


#: entries of a stacked tensor averaged per float64 product: bounds the float64 copy of a
#: block to 32 MB whatever the cohort (a round's uploads of 10,000 MLP clients are 3 GB)
MEAN_ELEMENTS = 1 << 22


def _mean_over_clients(v: Tensor, w: Tensor) -> Tensor:
    if not v.is_floating_point():
        return v[0].clone()  # integer buffers (e.g. BN batch counters) are not averaged
    # in float64, one product of the weights with a block of columns at a time: one read of
    # the stacked tensor and one call per block (a loop over clients made one call per
    # client: 90 against 36 µs for 8 clients of 100 entries)
    rows = v.reshape(v.shape[0], -1)
    w = w.to(v.device)
    out = torch.empty(rows.shape[1], dtype=v.dtype, device=v.device)
    columns = max(1, MEAN_ELEMENTS // max(rows.shape[0], 1))
    for start in range(0, rows.shape[1], columns):
        block = rows[:, start : start + columns]
        out[start : start + block.shape[1]] = w @ block.double()
    return out.reshape(v.shape[1:])


def weighted_mean(stacked: Mapping, weights: Tensor) -> Tree:
    """Average stacked tensors over the client axis with (unnormalised) ``weights``."""
    w = weights.to(torch.float64)
    w = w / w.sum()
    return tree_map(lambda v: _mean_over_clients(v, w), stacked)


def nbytes(tree: Mapping) -> int:
    """Bytes held by the tensors of a tree (what a message carrying it costs)."""
    return int(sum(v.numel() * v.element_size() for v in leaves(tree)))


def clone(tree: Mapping) -> Tree:
    return tree_map(lambda v: v.clone(), tree)
