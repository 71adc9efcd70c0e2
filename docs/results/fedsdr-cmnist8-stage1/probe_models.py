"""Diagnostic: what the final models of finished cmnist runs read, from their checkpoints.

For each run (FedSDR, FedPIN, or any method whose model is cmnist's one-hidden-layer MLP)
and each of its models — FedSDR's shortcut model ω∘Ψ (stage 1), the personal models f_u, a
global model, FedPIN's anchor (Φ_g, ω_g), personal model and local ERM model Ψ_u — on every
client's own test images:

* ``flip``: the share of predictions that change when the image's two colour channels are
  swapped (a colour-only model: 100; a digit-only model: 0);
* accuracy at p_te = 0.0, 0.5 and 1.0 (a colour-only model: 0 / 50 / 100 before label noise);
* linear probes of each client's model on its own p_te = 0.5 rows (where the colour is
  independent of the label), fitted on half of them and scored on the other half, averaged
  over clients: the label from the hidden layer (above 50 only
  through the digit; 75 is the ceiling under 25 % label noise) and the colour;
* ``zero_features``: the share of p_te = 0.5 inputs whose hidden layer is all zero (the
  model answers them with its bias alone), and ``live_units``: the share of hidden units
  active on at least one of them (the rest are dead);
* for FedSDR, stage 1's clamp: λ·ℓ_dis of the final Ψ and environment classifiers over random
  minibatches of the training rows, and the share of minibatches where it is below α_th (the
  only ones where −min(α_th, λ·ℓ_dis) passes a gradient to Ψ).

    python docs/results/fedsdr-cmnist8-stage1/probe_models.py --db runs/t51-paper-v3.db \
        65886a8d72 b194dd528b e9cde20461 91b35c9f10

Needs the runs' final checkpoints (``runs/checkpoints/RUN.pt``; ``fedshift runs --prune``
deletes them) and the data root (FEDSHIFT_DATA). Prints one line per model and a JSON list.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

import fedshift as fs
from fedshift.algorithms.common.representation import environment_disagreement
from fedshift.experiment import build_experiment

_data: dict = {}


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


def part(tree: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in tree.items() if k.startswith(prefix)}


def hidden(p: dict, x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x.flatten(1) @ p["extractor.fc1.weight"].T + p["extractor.fc1.bias"])


def logits(p: dict, x: torch.Tensor) -> torch.Tensor:
    return hidden(p, x) @ p["head.weight"].T + p["head.bias"]


def data_of(cfg: dict):
    key = json.dumps({k: v for k, v in cfg.items() if k.startswith("scenario") or k == "seed"})
    if key not in _data:
        _data[key] = build_experiment(fs.make_config(**{**cfg, "rounds": 1})).ctx.data
    return _data[key]


def probes(features: torch.Tensor, label: torch.Tensor, colour: torch.Tensor) -> dict:
    f = features.numpy()
    perm = np.random.default_rng(0).permutation(len(f))
    fit, score = perm[: len(f) // 2], perm[len(f) // 2 :]
    out = {}
    for name, t in (("probe_label", label.numpy()), ("probe_colour", colour.numpy())):
        model = LogisticRegression(max_iter=2000).fit(f[fit], t[fit])
        out[name] = 100 * model.score(f[score], t[score])
    return out


def model_rows(run: str, label: str, params_of, data) -> dict:
    tests = {p: data.test[f"p={p}"] for p in ("0.0", "0.5", "1.0")}
    half = tests["0.5"]
    flips, acc, probe_rows, zero, live = [], {p: [] for p in tests}, [], [], []
    with torch.no_grad():
        for u in range(half.num_clients):
            p = params_of(u)
            lo, hi = int(half.offsets[u]), int(half.offsets[u + 1])
            x, y = half.x[lo:hi], half.y[lo:hi]
            pred = logits(p, x).argmax(1)
            flips.append((pred != logits(p, x.flip(1)).argmax(1)).float().mean().item())
            for name, split in tests.items():
                xs, yt = split.x[lo:hi], split.y[lo:hi]
                acc[name].append((logits(p, xs).argmax(1) == yt).float().mean().item())
            colour = x.flatten(2).sum(-1).argmax(1)
            h = hidden(p, x)
            probe_rows.append(probes(h, y, colour))
            zero.append((h.abs().sum(1) == 0).float().mean().item())
            live.append((h > 0).any(0).float().mean().item())
    row = {"run": run, "model": label, "flip": 100 * float(np.mean(flips))}
    row["zero_features"], row["live_units"] = 100 * float(np.mean(zero)), 100 * float(np.mean(live))
    row.update({f"acc_p{name}": 100 * float(np.mean(v)) for name, v in acc.items()})
    row.update({k: float(np.mean([r[k] for r in probe_rows])) for k in probe_rows[0]})
    return row


def clamp_share(server: dict, cfg: dict, data) -> dict:
    lam = float(cfg.get("algorithm.lambda_", 0.5))
    alpha = float(cfg.get("algorithm.alpha_th", 1.0))
    with torch.no_grad():
        z = hidden(part(server, "sd/p/"), data.train.x)
        env = torch.einsum("bd,ekd->ebk", z, server["env.weight"]) + server["env.bias"][:, None]
        perm = torch.randperm(len(z), generator=torch.Generator().manual_seed(0))
        batch = int(cfg.get("batch_size", 64))
        scaled = torch.tensor(
            [
                lam
                * float(environment_disagreement(env[:, perm[i : i + batch]], torch.ones(batch)))
                for i in range(0, len(z) - batch + 1, batch)
            ]
        )
    return {
        "alpha_th": alpha,
        "lambda_dis_median": float(scaled.median()),
        "share_below_alpha_th": 100 * float((scaled <= alpha).float().mean()),
    }


def report(db: str, run: str) -> list[dict]:
    row = sqlite3.connect(db).execute("select config from runs where run_id=?", (run,)).fetchone()
    if row is None:
        raise SystemExit(f"no run {run} in {db}")
    cfg = json.loads(row[0])
    path = Path(db).parent / "checkpoints" / f"{run}.pt"
    ck = torch.load(path, weights_only=False, map_location="cpu")
    if ck["rounds_done"] != cfg["rounds"]:
        raise SystemExit(f"{path} holds round {ck['rounds_done']} of {cfg['rounds']}")
    data = data_of(cfg)
    server, clients = flat(ck["server"]), flat(ck.get("clients") or {})
    name = f"{cfg['algorithm']} seed {cfg['seed']}"
    rows = []
    if part(server, "sd/p/"):
        shortcut = part(server, "sd/p/")
        rows.append(model_rows(run, f"{name}: ω∘Ψ", lambda u: shortcut, data))
        rows[-1].update(clamp_share(server, cfg, data))
    personal, shared = part(clients, "p/"), part(server, "p/")
    if personal:  # a client keeps its own part (FedRep: the head), the rest is the server's

        def own(u: int) -> dict:
            return {**shared, **{k: v[u] for k, v in personal.items()}}

        rows.append(model_rows(run, f"{name}: personal", own, data))
    if "head.weight" in shared:
        label = "anchor (Φ_g, ω_g)" if part(clients, "pm/p/") else "global"
        rows.append(model_rows(run, f"{name}: {label}", lambda u: shared, data))
    for prefix, label in (("pm/p/", "personal"), ("psi/p/", "Ψ_u (local ERM)")):  # FedPIN's
        kept = part(clients, prefix)
        if kept:
            rows.append(
                model_rows(
                    run,
                    f"{name}: {label}",
                    lambda u, kept=kept: {k: v[u] for k, v in kept.items()},
                    data,
                )
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--db", default="runs/fedshift.db")
    args = ap.parse_args()
    rows = [r for run in args.runs for r in report(args.db, run)]
    for r in rows:
        clamp = (
            f"  λ·ℓ_dis {r['lambda_dis_median']:.2f}, below α_th {r['share_below_alpha_th']:.0f} %"
            if "alpha_th" in r
            else ""
        )
        print(
            f"{r['run']} {r['model']:32s} flip {r['flip']:5.1f}  acc {r['acc_p0.0']:5.1f} / "
            f"{r['acc_p0.5']:5.1f} / {r['acc_p1.0']:5.1f}  probe label {r['probe_label']:5.1f} "
            f"colour {r['probe_colour']:5.1f}  zero {r['zero_features']:5.1f}  live "
            f"{r['live_units']:5.1f}{clamp}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
