"""Cluster purity of a recorded IFCA (or CFL) run against the scenario's true client groups
(``info["client_group"]``, e.g. of ``rotation-groups``), from the run store.

    python purity.py DB RUN_ID    # purity and adjusted Rand index per round, final table
"""

import json
import sqlite3
import sys
from collections import Counter

import numpy as np
from sklearn.metrics import adjusted_rand_score

from fedshift.data.registry import build_scenario

db, run_id = sys.argv[1], sys.argv[2]
con = sqlite3.connect(db)
cfg = json.loads(con.execute("select config from runs where run_id=?", (run_id,)).fetchone()[0])
opts = {k.split(".", 1)[1]: v for k, v in cfg.items() if k.startswith("scenario.")}
truth = build_scenario(cfg["scenario"], opts, cfg["seed"], cfg["data_dir"] or None).info[
    "client_group"
]
query = "select round, extras from rounds where run_id=? order by round"
for rnd, extras in con.execute(query, (run_id,)):
    log = json.loads(extras or "{}")
    ids = log["clients"]
    pred, true = log["cluster"], [truth[i] for i in ids]
    hits = sum(
        Counter(t for t, p in zip(true, pred, strict=False) if p == c).most_common(1)[0][1]
        for c in set(pred)
    )
    ari = adjusted_rand_score(true, pred)
    print(f"round {rnd}: purity {hits / len(ids):.3f}, adjusted Rand {ari:.3f}")
table = np.zeros((max(truth) + 1, max(pred) + 1), dtype=int)
for t, p in zip(true, pred, strict=False):
    table[t, p] += 1
print("last round, rows = true group, columns = cluster:\n", table)
