"""The ClientApp: one SuperNode = one fedshift client (its ``partition-id``).

Every message carries the run's resolved config; the node builds the same experiment
(scenario, seeded model, context, algorithm) from it — once per process, then cached — and
runs the algorithm contract for a cohort of one:

* ``query``: reports the node's ``partition-id`` / ``num-partitions`` (client id, N);
* ``train``: ``client_update`` on the payload of its client (broadcast + its own row of the
  per-client payload), keeps the new persistent client state in the node's Flower
  ``Context.state`` and replies with the upload (``ArrayRecord``) and its loss and
  aggregation weight (``MetricRecord``);
  A ``train`` message with the server state instead of a payload is a round where the
  client was not sampled but its method trains anyway (``update_unsampled``); no upload;
* ``evaluate``: builds the client's predictor from the server state it receives and its own
  persistent state and replies with correct / total counts on each of its test and
  validation environments (the data never leaves the node).

Randomness is derived from (seed, round, client id, purpose), so a client computed alone
here gives the numbers it gets inside a batched cohort in-process.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ..algorithms.base import Payload
from ..engine.tree import Tree, empty_parts_like, flatten, stack, tree_map, unflatten
from ..errors import FedshiftError
from ..eval.evaluate import label_counts, prediction_counts
from ..experiment import Experiment, build_experiment
from .records import config_from_json, from_record, to_record

_CACHE: OrderedDict[str, Experiment] = OrderedDict()
_CACHE_SIZE = 2
_TIMES = {"first": True, "build": 0.0}  # where a node's time goes (reported per message)

client_app = ClientApp()


def node_client(context: Context) -> tuple[int, int]:
    """(client id, number of clients) this node was started for."""
    cfg = context.node_config
    if "partition-id" not in cfg or "num-partitions" not in cfg:
        raise FedshiftError(
            "this SuperNode has no partition; start it with "
            '--node-config "partition-id=I num-partitions=N"'
        )
    return int(cfg["partition-id"]), int(cfg["num-partitions"])


def experiment(config_json: str, context: Context) -> Experiment:
    """The node's experiment for a run config (built once per process and cached)."""
    data_dir = str(context.node_config.get("data-dir", ""))
    key = config_json + "\0" + data_dir
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    cfg = config_from_json(config_json)
    if data_dir:  # this node's own data root
        cfg.data_dir = data_dir
    elif cfg.data_dir and not os.path.isdir(cfg.data_dir):
        cfg.data_dir = ""  # the server's path does not exist here: use $FEDSHIFT_DATA
    t0 = time.perf_counter()
    exp = build_experiment(cfg)
    _TIMES["build"] += time.perf_counter() - t0
    _CACHE[key] = exp
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return exp


def _state_key(job: str) -> str:
    return f"fedshift.{job}.state"


def _load_state(exp: Experiment, context: Context, job: str) -> Tree:
    template = exp.runner.store.template
    if not template:
        return {}
    dev = exp.ctx.device
    key = _state_key(job)
    if key in context.state.array_records:
        return empty_parts_like(from_record(context.state.array_records[key], dev), template)
    return stack(tree_map(lambda v: v.to(dev), template), 1)


def _save_state(exp: Experiment, context: Context, job: str, state: Tree) -> None:
    template = exp.runner.store.template
    if state and template:  # as the in-process store keeps it: the template's dtypes
        like = flatten(template)
        state = unflatten({k: v.to(like[k].dtype) for k, v in flatten(state).items()})
        context.state[_state_key(job)] = to_record(state)


def _process_age() -> float:
    """Seconds since this process started (Python, imports, Flower's FAB install)."""
    try:
        import psutil

        return max(time.time() - psutil.Process().create_time(), 0.0)
    except ImportError:
        return 0.0


def _timings(t_enter: float, t_update: float) -> dict[str, float]:
    """startup: process start → handler (first message of a process only); build: scenario,
    model and algorithm (0 when cached); update: the algorithm's client work."""
    startup = _process_age() - (time.perf_counter() - t_enter) if _TIMES["first"] else 0.0
    out = {"t_startup": startup, "t_build": _TIMES["build"], "t_update": t_update}
    _TIMES["first"], _TIMES["build"] = False, 0.0
    return out


def _setup(message: Message, context: Context) -> tuple[Experiment, int, int, str]:
    job = message.content.config_records["job"]
    exp = experiment(str(job["config"]), context)
    cid, n = node_client(context)
    if n != exp.data.num_clients:
        raise FedshiftError(
            f"this SuperNode was started with num-partitions={n} but the scenario has "
            f"{exp.data.num_clients} clients"
        )
    if int(job["client"]) != cid:
        raise FedshiftError(f"message for client {job['client']} reached client {cid}")
    return exp, cid, int(job["round"]), str(job["job"])


@client_app.query()
def query(message: Message, context: Context) -> Message:
    cid, n = node_client(context)
    reply = RecordDict({"node": MetricRecord({"partition-id": cid, "num-partitions": n})})
    return Message(reply, reply_to=message)


@client_app.train()
def train(message: Message, context: Context) -> Message:
    t_enter = time.perf_counter()
    exp, cid, round_, job = _setup(message, context)
    dev = exp.ctx.device
    cohort = exp.ctx.cohort(torch.tensor([cid]), round_)
    arrays = message.content.array_records
    if "broadcast" not in arrays:  # not sampled: update_unsampled on the server state
        t0 = time.perf_counter()
        server = empty_parts_like(
            from_record(arrays.get("server", ArrayRecord()), dev), exp.runner.server
        )
        state = exp.algorithm.update_unsampled(server, _load_state(exp, context, job), cohort)
        _save_state(exp, context, job, state)
        timings = _timings(t_enter, time.perf_counter() - t0)
        return Message(RecordDict({"result": MetricRecord(timings)}), reply_to=message)
    payload = Payload(
        broadcast=from_record(arrays.get("broadcast"), dev),
        per_client=from_record(arrays.get("per_client"), dev),
    )
    t0 = time.perf_counter()
    result = exp.algorithm.client_update(payload, _load_state(exp, context, job), cohort)
    t_update = time.perf_counter() - t0
    _save_state(exp, context, job, result.state)
    reply = RecordDict(
        {
            "upload": to_record(result.upload),
            "result": MetricRecord(
                {
                    "num_examples": float(result.num_examples.reshape(-1)[0]),
                    "loss": float(result.loss.detach().reshape(-1)[0]),
                    **_timings(t_enter, t_update),
                }
            ),
        }
    )
    return Message(reply, reply_to=message)


@client_app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    exp, cid, round_, job = _setup(message, context)
    ctx = exp.ctx
    cohort = ctx.cohort(torch.tensor([cid]), round_)
    server = from_record(message.content.array_records.get("server", ArrayRecord()), ctx.device)
    server = empty_parts_like(server, exp.runner.server)  # the method's init: its empty parts
    pred = exp.algorithm.predictor(server, _load_state(exp, context, job), cohort)
    counts: dict[str, list[int]] = {}
    k = exp.data.num_classes
    parts = [("test", exp.data.test), ("val", exp.data.val)]
    if exp.runner.is_final(round_):  # the last evaluation: the degeneracy check's training fit
        parts.append(("train", {"train": exp.data.train}))
    for name, splits in parts:
        if not splits:
            continue
        correct, total, saturated = [], [], []
        predicted, labels = torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
        for split in splits.values():
            c, t, guessed, sat = prediction_counts(
                ctx, pred.params, pred.buffers, pred.shared, split, cohort.ids
            )
            correct.append(int(c[0]))
            total.append(int(t[0]))
            saturated.append(int(sat[0]))
            predicted += guessed[0]
            labels += label_counts(split, cohort.ids, k)[0]
        counts[f"{name}.correct"], counts[f"{name}.total"] = correct, total
        counts[f"{name}.predicted"], counts[f"{name}.labels"] = predicted.tolist(), labels.tolist()
        counts[f"{name}.saturated"] = saturated
    return Message(RecordDict({"counts": MetricRecord(counts)}), reply_to=message)
