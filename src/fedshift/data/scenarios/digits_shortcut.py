"""``digits-shortcut``: the offline demo scenario, a planted colour shortcut on sklearn digits.

Each 8×8 digit (grey, identical in the three channels) sits inside a 2-pixel border of one
of ten fixed class colours, giving 3×12×12 images. In an environment with parameter p the
border has the colour of the sample's label with probability p and otherwise the colour of
a uniformly chosen other class. Training environments have high p, so the border is an
easy shortcut; test environments sweep p from 0 to 1 over the *same* test images (only the
border differs), so a model that learned the shortcut does well at p = 1 and badly at
p = 0. ``oracle`` colours training borders independently of the label: the shortcut-free
reference. ``label_noise`` (off by default) replaces each label, once for all environments,
by a uniformly chosen other class with that probability before the border is drawn, so the
colour can be a better predictor than the digit (as in Arjovsky et al.'s Coloured MNIST).
Builds in milliseconds from data shipped with scikit-learn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...options import opt, require
from .. import partition as P
from ..digits import load_digits
from ..federated import FederatedData, Split
from ..registry import register_scenario
from ._images import env_name, require_probabilities

NUM_CLASSES = 10
BORDER = 2
SIZE = 8 + 2 * BORDER
# Ten well-separated RGB colours, one per class (pairwise distance ≥ 0.4).
COLOURS = torch.tensor(
    [
        [0.90, 0.10, 0.10],  # red
        [0.10, 0.70, 0.10],  # green
        [0.10, 0.25, 0.95],  # blue
        [0.95, 0.95, 0.20],  # yellow
        [0.85, 0.10, 0.85],  # magenta
        [0.10, 0.85, 0.85],  # cyan
        [1.00, 0.50, 0.00],  # orange
        [0.45, 0.10, 0.55],  # purple
        [0.50, 0.30, 0.10],  # brown
        [1.00, 1.00, 1.00],  # white
    ]
)


@dataclass
class DigitsShortcutOptions:
    clients: int = opt(8, "number of clients (the digits are dealt evenly)")
    p_train: list[float] = opt(
        [0.95, 0.85], "training environments: P(border colour = label's colour), one per client"
    )
    p_test: list[float] = opt(
        [round(0.1 * i, 1) for i in range(11)], "test environments (same images, new borders)"
    )
    p_val: float = opt(0.1, "validation environment (for model selection, never test)")
    test_fraction: float = opt(0.3, "fraction of each client's images used for testing")
    val_fraction: float = opt(0.1, "fraction of each client's images used for validation")
    label_noise: float = opt(
        0.0, "probability a label is replaced by another class before the border is drawn"
    )
    oracle: bool = opt(False, "colour training borders independently of the label")
    participation: float = opt(1.0, "default fraction of clients sampled per round")

    def __post_init__(self) -> None:
        require(self.clients >= 1, f"scenario.clients={self.clients} must be at least 1")
        for key in ("p_train", "p_test"):
            require_probabilities(key, getattr(self, key))
        require(0.0 <= self.p_val <= 1.0, f"scenario.p_val={self.p_val} must lie in [0, 1]")
        require(
            0.0 <= self.label_noise < 0.9,
            f"scenario.label_noise={self.label_noise} must lie in [0, 0.9)",
        )
        require(
            0.0 < self.test_fraction
            and 0.0 <= self.val_fraction
            and self.test_fraction + self.val_fraction < 1.0,
            f"scenario.test_fraction={self.test_fraction} and val_fraction="
            f"{self.val_fraction} must be non-negative (test > 0) with a sum below 1",
        )
        require(
            0.0 < self.participation <= 1.0,
            f"scenario.participation={self.participation} must lie in (0, 1]",
        )


def border_classes(y: np.ndarray, p: np.ndarray | float, rng: np.random.Generator) -> np.ndarray:
    """Border class per sample: the label with probability ``p``, else a uniformly random
    other class."""
    agree = rng.random(len(y)) < p
    other = (y + rng.integers(1, NUM_CLASSES, size=len(y))) % NUM_CLASSES
    return np.where(agree, y, other)


def render(digits: torch.Tensor, colour_class: np.ndarray) -> torch.Tensor:
    """``[n, 8, 8]`` grey digits in [0, 1] → ``[n, 3, 12, 12]`` with coloured borders."""
    colours = COLOURS[torch.from_numpy(np.asarray(colour_class, dtype=np.int64))]  # [n, 3]
    x = colours[:, :, None, None].expand(-1, -1, SIZE, SIZE).contiguous()
    x[:, :, BORDER:-BORDER, BORDER:-BORDER] = digits.unsqueeze(1)
    return x


@register_scenario(
    "digits-shortcut",
    DigitsShortcutOptions,
    "offline demo: sklearn digits with a border colour that agrees with the label w.p. p",
)
def build_digits_shortcut(
    o: DigitsShortcutOptions, seed: int, data_dir: Path | None
) -> FederatedData:
    x, y = load_digits("all")
    y_np = y.numpy()
    if o.label_noise > 0:  # one draw per image, so every environment sees the same labels
        y_np = border_classes(y_np, 1.0 - o.label_noise, P.make_rng(seed, "digits-shortcut/noise"))
    n = len(y_np)
    require(o.clients <= n, f"scenario.clients={o.clients} exceeds the {n} digit images")
    whole = P.iid(n, o.clients, P.make_rng(seed, "digits-shortcut/clients"))
    sizes = whole.sizes()
    n_test = np.floor(o.test_fraction * sizes + 0.5).astype(np.int64)
    n_val = np.minimum(
        np.floor(o.val_fraction * sizes + 0.5).astype(np.int64), np.maximum(sizes - n_test - 1, 0)
    )
    rest, test_part = P.take(whole, n_test, P.make_rng(seed, "digits-shortcut/test-split"))
    train_part, val_part = P.take(rest, n_val, P.make_rng(seed, "digits-shortcut/val-split"))

    # one training environment per client, round-robin over a seeded shuffled client order
    order = P.make_rng(seed, "digits-shortcut/envs").permutation(o.clients)
    client_env = np.empty(o.clients, dtype=np.int64)
    client_env[order] = np.arange(o.clients) % len(o.p_train)
    env = np.repeat(client_env, train_part.sizes())
    ty = y_np[train_part.indices]
    rng = P.make_rng(seed, "digits-shortcut/train-colours")
    if o.oracle:
        colour = rng.integers(0, NUM_CLASSES, size=len(ty))
    else:
        colour = border_classes(ty, np.asarray(o.p_train, dtype=np.float64)[env], rng)
    train = Split(
        render(x[torch.from_numpy(train_part.indices)], colour),
        torch.from_numpy(ty),
        torch.from_numpy(train_part.offsets),
        torch.from_numpy(env),
    )

    def environment(part: P.Partition, p: float, purpose: str) -> Split:
        # seeded by the value of p, so "p=0.3" is the same whatever else is listed
        g = P.make_rng(seed, purpose, int(round(p * 1_000_000)))
        yy = y_np[part.indices]
        xx = render(x[torch.from_numpy(part.indices)], border_classes(yy, p, g))
        return Split(xx, torch.from_numpy(yy), torch.from_numpy(part.offsets))

    test = {env_name(p): environment(test_part, p, "digits-shortcut/test") for p in o.p_test}
    val = {env_name(o.p_val): environment(val_part, o.p_val, "digits-shortcut/val")}
    return FederatedData(
        name="digits-shortcut",
        num_classes=NUM_CLASSES,
        input_shape=(3, SIZE, SIZE),
        train=train,
        test=test,
        val=val,
        train_env_names=[env_name(p) for p in o.p_train],
        default_model="mlp",
        participation=o.participation,
        info={
            "dataset": "digits",
            "oracle": o.oracle,
            "client_train_env": [env_name(o.p_train[e]) for e in client_env],
        },
    )
