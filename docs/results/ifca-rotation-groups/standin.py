"""IFCA's cluster recovery on MNIST in 4 rotation groups (a stand-in for the `rotation-groups`
scenario until it lands): Dir(8) label mixes over 40 clients (10k images), group g rotated
by g·90° (train, val and test), groups a seeded permutation of round-robin labels.

    python standin.py ALGORITHM DB    # runs 20 rounds, prints cluster purity per round
"""

import json
import sqlite3
import sys
from collections import Counter

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

import fedshift as fs
from fedshift.data.federated import Split
from fedshift.data.registry import build_scenario

N, G = 40, 4
algorithm, db = sys.argv[1], sys.argv[2]
data = build_scenario("dirichlet", {"alpha": 8.0, "clients": N, "samples": 10000}, 0, None)
group = np.random.default_rng(1234).permutation(np.arange(N) % G)


def rotate(split: Split) -> Split:
    x = split.x.clone()
    for i in range(N):
        lo, hi = int(split.offsets[i]), int(split.offsets[i + 1])
        x[lo:hi] = torch.rot90(x[lo:hi], int(group[i]), dims=(-2, -1))
    return Split(x, split.y, split.offsets)


data.train = rotate(data.train)
data.test = {k: rotate(v) for k, v in data.test.items()}
data.val = {k: rotate(v) for k, v in data.val.items()}
data.name = "rotation-groups-standin"
out = fs.run(
    algorithm=algorithm,
    data=data,
    model="mlp",
    rounds=20,
    lr=0.1,
    batch_size=10,
    local_epochs=1,
    eval_every=5,
    seed=0,
    db=db,
)
print(json.dumps({k: out.summary()[k] for k in ("run_id", "algorithm", "metrics")})[:300])
con = sqlite3.connect(db)
query = "select round, extras from rounds where run_id=? order by round"
for rnd, extras in con.execute(query, (out.run_id,)):
    log = json.loads(extras or "{}")
    if "cluster" not in log:
        break
    pred = [c for _, c in sorted(zip(log["clients"], log["cluster"], strict=False))]
    true = [int(group[i]) for i in sorted(log["clients"])]
    hits = sum(
        Counter(t for t, p in zip(true, pred, strict=False) if p == c).most_common(1)[0][1]
        for c in set(pred)
    )
    ari = adjusted_rand_score(true, pred)
    print(f"round {rnd}: purity {hits / len(pred):.3f}, adjusted Rand {ari:.3f}")
