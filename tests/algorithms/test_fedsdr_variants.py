"""FedSDR+FedAvg and FedSDR+pFedMe (src/fedshift/algorithms/fedsdr_variants.py):
FedSDR+pFedMe averages its global model uniformly (Alg. 4 line 21)."""

from __future__ import annotations

from helpers import invariant_experiment as experiment
from helpers import uniform_check

from fedshift.engine.tree import flatten, stack, unflatten


def test_fedsdr_pfedme_averages_the_global_model_uniformly():
    exp = experiment("fedsdr-pfedme", {"inner_steps": 1})
    server = flatten(exp.runner.server)
    keys = [k for k in server if k.startswith(("p/", "sd/p/"))]
    rest = {k: v for k, v in server.items() if k.startswith(("env.", "sd/b/", "b/"))}

    def aggregate(server, uploads, info):
        uploads = unflatten({**flatten(uploads), **stack(rest, 2)})
        return exp.runner.alg.aggregate(server, uploads, info)

    uniform_check(exp, keys, aggregate)
