"""Attribute-skew scenarios of DFL §4 (Luo et al., ICML 2022) on the disentanglement
datasets: ``dsprites`` (classify the sprite's scale, 6 classes; skew = orientation) and
``3dshapes`` (classify the object's shape, 4 classes; skew = background colour or scale).

Skew means each client sees only some values of the attribute: in ``dsprites`` the 40
orientation values are dealt round-robin over the clients (40 clients: one orientation
each); in ``3dshapes`` with ``skew = "bg-colour"`` the 100 (floor hue, wall hue) pairs are
dealt over the clients after a seeded shuffle (50 clients: two pairs each, "each client
has a different floor and wall colour"), with ``skew = "scale"`` the 8 object scales are
dealt round-robin (10 clients, as in DFL: two scales are then shared by two clients).
A client's images are those with its attribute values; ``test_ratio`` of them (DFL: 0.5)
form its test set and ``train_ratio`` of them (DFL: 0.2 dSprites, 0.01 3dshapes) its
training set, train and test from the same distribution. ``max_per_client`` caps a
client's pool before the ratios (0 = all, the paper; the full pools need several GB as
float32, so set it on small machines). Images are downsampled to ``image_size`` by area
averaging (default 32 px).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...options import opt, require
from .. import partition as P
from ..federated import FederatedData, Split
from ..registry import register_scenario
from ..sprites import load_3dshapes_factors, load_3dshapes_images, load_dsprites

DSPRITES_SCALE, DSPRITES_ORIENT = 2, 3
SHAPES_FLOOR, SHAPES_WALL, SHAPES_SCALE, SHAPES_SHAPE = 0, 1, 3, 4


@dataclass
class _SpriteOptions:
    train_ratio: float = opt(0.2, "fraction of each client's images used for training")
    test_ratio: float = opt(0.5, "fraction of each client's images used for testing (DFL 0.5)")
    max_per_client: int = opt(0, "cap on each client's image pool before the ratios (0 = all)")
    image_size: int = opt(32, "images are downsampled to image_size × image_size")
    val_fraction: float = opt(0.1, "fraction of the unused images (after train/test) as 'val'")
    participation: float = opt(0.5, "default fraction of clients sampled per round (DFL 20/40)")
    download: bool = opt(False, "download the released file if missing (off: offline)")

    def __post_init__(self) -> None:
        require(self.clients >= 1, f"scenario.clients={self.clients} must be at least 1")
        require(
            0 < self.train_ratio
            and 0 < self.test_ratio
            and self.train_ratio + self.test_ratio <= 1,
            f"scenario.train_ratio={self.train_ratio} and test_ratio={self.test_ratio} must be "
            "positive with a sum of at most 1",
        )
        require(self.max_per_client >= 0, "scenario.max_per_client must be 0 (all) or more")
        require(4 <= self.image_size <= 64, "scenario.image_size must lie in 4..64")
        require(0.0 <= self.val_fraction < 1.0, "scenario.val_fraction must lie in [0, 1)")
        require(0.0 < self.participation <= 1.0, "scenario.participation must lie in (0, 1]")


@dataclass
class DSpritesOptions(_SpriteOptions):
    clients: int = opt(40, "clients; the 40 orientations are dealt round-robin (DFL: 40)")


@dataclass
class Shapes3DOptions(_SpriteOptions):
    skew: str = opt(
        "bg-colour", "attribute skew: bg-colour (floor+wall hue) or scale", ("bg-colour", "scale")
    )
    clients: int = opt(0, "clients (0 = DFL's: 50 for bg-colour, 10 for scale)")
    train_ratio: float = opt(0.01, "fraction of each client's images used for training (DFL)")
    participation: float = opt(0.4, "default fraction sampled per round (DFL 20/50, 10/10)")

    def __post_init__(self) -> None:
        if self.clients == 0:
            self.clients = 50 if self.skew == "bg-colour" else 10
            if self.skew == "scale" and self.participation == 0.4:
                self.participation = 1.0
        super().__post_init__()


def _partition(owner: np.ndarray, o, seed: int, name: str):
    """Per client: shuffled pool (capped), then test / train / val parts (index arrays)."""
    parts = {"train": [], "test": [], "val": []}
    for k in range(o.clients):
        pool = np.flatnonzero(owner == k)
        pool = P.make_rng(seed, f"{name}/pool", k).permutation(pool)
        if o.max_per_client:
            pool = pool[: o.max_per_client]
        n = len(pool)
        n_te = int(round(o.test_ratio * n))
        n_tr = max(1, int(round(o.train_ratio * n))) if n > n_te else 0
        rest = pool[n_te + n_tr :]
        n_val = int(round(o.val_fraction * len(rest)))
        parts["test"].append(np.sort(pool[:n_te]))
        parts["train"].append(np.sort(pool[n_te : n_te + n_tr]))
        parts["val"].append(np.sort(rest[:n_val]))
    return parts


def _resize(x: torch.Tensor, size: int) -> torch.Tensor:
    x = x.float()
    if x.shape[-1] != size:
        x = F.interpolate(x, size=(size, size), mode="area")
    return x


def _assemble(name, parts, pixels_of, labels, attr, attr_names, o, num_classes, channels, info):
    def split(key, with_env=False):
        items = [(pixels_of(ix), torch.from_numpy(labels[ix])) for ix in parts[key]]
        env = [torch.from_numpy(attr[ix]) for ix in parts[key]] if with_env else None
        return Split.from_clients(items, env)

    return FederatedData(
        name=name,
        num_classes=num_classes,
        input_shape=(channels, o.image_size, o.image_size),
        train=split("train", True),
        test={"test": split("test")},
        val={"val": split("val")},
        train_env_names=attr_names,
        default_model="dfl-cnn",
        participation=o.participation,
        info=info,
    )


@register_scenario(
    "dsprites",
    DSpritesOptions,
    "dSprites: classify scale (6); each client sees its own orientations (DFL §4, 40 clients)",
)
def build_dsprites(o: DSpritesOptions, seed: int, data_dir: Path | None) -> FederatedData:
    imgs, lat = load_dsprites(data_dir, o.download)
    lat = lat.numpy()
    orient = lat[:, DSPRITES_ORIENT]
    n_orient = int(orient.max()) + 1
    require(
        o.clients <= n_orient,
        f"scenario.clients={o.clients} exceeds the {n_orient} orientations to deal",
    )
    owner = orient % o.clients
    parts = _partition(owner, o, seed, "dsprites")
    scale = lat[:, DSPRITES_SCALE].astype(np.int64)

    def pixels_of(ix):
        return _resize(imgs[torch.from_numpy(ix)].unsqueeze(1), o.image_size)

    names = [f"orientation={j}" for j in range(n_orient)]
    info = {
        "dataset": "dsprites",
        "client_orientations": [
            [int(j) for j in range(n_orient) if j % o.clients == k] for k in range(o.clients)
        ],
    }
    return _assemble(
        "dsprites",
        parts,
        pixels_of,
        scale,
        orient.astype(np.int64),
        names,
        o,
        int(scale.max()) + 1,
        1,
        info,
    )


@register_scenario(
    "3dshapes",
    Shapes3DOptions,
    "3dshapes: classify shape (4); skew = background colour (50 clients) or scale (10)",
)
def build_3dshapes(o: Shapes3DOptions, seed: int, data_dir: Path | None) -> FederatedData:
    factors = load_3dshapes_factors(data_dir, o.download)
    if o.skew == "bg-colour":
        n_wall = int(factors[:, SHAPES_WALL].max()) + 1
        attr = factors[:, SHAPES_FLOOR] * n_wall + factors[:, SHAPES_WALL]
        n_attr = (int(factors[:, SHAPES_FLOOR].max()) + 1) * n_wall
        perm = P.make_rng(seed, "3dshapes/attributes").permutation(n_attr)
        attr_owner = np.empty(n_attr, dtype=np.int64)
        attr_owner[perm] = np.arange(n_attr) % o.clients
        names = [f"floor={a // n_wall},wall={a % n_wall}" for a in range(n_attr)]
    else:
        attr = factors[:, SHAPES_SCALE]
        n_attr = int(attr.max()) + 1
        names = [f"scale={a}" for a in range(n_attr)]
        attr_owner = None
    attr = attr.astype(np.int64)
    if attr_owner is not None:
        parts = _partition(attr_owner[attr], o, seed, "3dshapes")
        owners = [np.flatnonzero(attr_owner == k).tolist() for k in range(o.clients)]
    else:  # scale: client k gets scale k mod 8 (more clients than scales share them)
        parts = {"train": [], "test": [], "val": []}
        owners = []
        for k in range(o.clients):
            a = k % n_attr
            sharers = [j for j in range(o.clients) if j % n_attr == a]
            owner = np.full(len(attr), -1)
            sel = np.flatnonzero(attr == a)
            # the images of a shared scale are dealt over its clients
            deal = P.make_rng(seed, "3dshapes/share", a).permutation(sel)
            mine = np.array_split(deal, len(sharers))[sharers.index(k)]
            owner[mine] = 0
            sub = _partition(owner, _OneClient(o), seed + k, "3dshapes")
            for key in parts:
                parts[key] += sub[key]
            owners.append([a])
    used = np.unique(np.concatenate([i for v in parts.values() for i in v]))
    pixels = _resize(load_3dshapes_images(used, data_dir, o.download), o.image_size).div_(255.0)

    def pixels_of(ix):
        return pixels[torch.from_numpy(np.searchsorted(used, ix))]

    shape = factors[:, SHAPES_SHAPE].astype(np.int64)
    info = {"dataset": "3dshapes", "skew": o.skew, "client_attributes": owners}
    return _assemble(
        "3dshapes", parts, pixels_of, shape, attr, names, o, int(shape.max()) + 1, 3, info
    )


class _OneClient:
    """The options of a one-client partition (3dshapes scale skew)."""

    def __init__(self, o) -> None:
        self.__dict__.update(vars(o))
        self.clients = 1
