"""The round loop: sample clients, run them in cohorts, aggregate, evaluate, account bytes.

This is the only loop over rounds and clients in fedshift; algorithms implement the
contract of ``fedshift.algorithms.base`` and never iterate themselves.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..data.federated import Split
from ..errors import Diverged, FedshiftError, RunStopped
from ..eval.evaluate import label_counts, prediction_counts
from ..eval.metrics import (
    EvalCounts,
    flag_chance_loss,
    flag_training_fit,
    summarize,
    training_fit,
)
from .checkpoint import save_checkpoint
from .context import Context
from .contract import Algorithm, RoundInfo
from .faults import FaultOptions, corrupt, finite, finite_rows, injected_fault, screen
from .local import TrainingAbandoned
from .sampling import clients_per_round as count_per_round
from .sampling import sample_clients
from .store import ClientStore
from .tree import (
    Rows,
    Tree,
    concat,
    empty_parts_like,
    flatten,
    leaves,
    nbytes,
    to_device,
    tree_map,
    unflatten,
)

# A run has diverged when more than this share of its rounds, or this many rounds in a row,
# trained nothing for numerical reasons (see lost_round); docs/reliability.md.
DIVERGED_FRACTION = 0.5
DIVERGED_STREAK = 5
SCREENED = ("nonfinite", "norm")  # uploads the numerical screen excluded
INJECTED = ("dropped", "delayed", "corrupted")  # faults the user asked for (faults.*)


@dataclass
class RoundRecord:
    round: int  # 1-based count of completed rounds
    loss: float
    bytes_up: int
    bytes_down: int
    time_s: float
    metrics: dict | None = None  # test summary when evaluated this round
    val: float | None = None  # mean validation accuracy when evaluated
    extras: dict = field(default_factory=dict)  # per-round figures logged by the algorithm


@dataclass
class RunResult:
    rounds: list[RoundRecord] = field(default_factory=list)
    accuracy: Tensor | None = None  # [N, E] final per-client × per-environment, percent
    env_names: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    val_accuracy: Tensor | None = None
    val_names: list[str] = field(default_factory=list)
    time_s: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    server: Tree = field(default_factory=dict)


class Runner:
    def __init__(
        self,
        algorithm: Algorithm,
        ctx: Context,
        *,
        rounds: int,
        participation: float,
        clients_per_round: int | None = None,
        eval_every: int = 0,
        state_device: str | torch.device | None = None,
        on_round: Callable[[RoundRecord], None] | None = None,
        faults: FaultOptions | None = None,
    ) -> None:
        self.alg = algorithm
        self.ctx = ctx
        self.rounds = rounds
        n = ctx.data.num_clients
        self.k = count_per_round(n, participation, clients_per_round)
        self.cohort_size = ctx.cohort_size if ctx.cohort_size > 0 else n  # one source
        self.eval_every = eval_every
        self.on_round = on_round
        self.server = to_device(algorithm.init(), ctx.device)
        self.start_round = 0
        self.checkpoint_path: Path | None = None
        self.checkpoint_every = 0
        self.checkpoint_meta: dict = {}  # the run it belongs to (run id, config hash)
        self.stop_requested = False
        # whether the round in progress has changed no state yet, so a stop request may
        # abandon it between local steps (the state is still that after the last round)
        self.abandonable = False
        ctx.trainer.should_stop = lambda: self.stop_requested and self.abandonable
        self.faults = faults or FaultOptions()
        self.pending: list[dict] = []  # late uploads (faults.delay), delivered in a later round
        self.store = ClientStore(
            algorithm.init_client_state(self.server), n, state_device or ctx.device
        )

    def chunks(self, ids: Tensor) -> list[Tensor]:
        return list(ids.split(self.cohort_size))

    def train_round(self, r: int) -> RoundRecord:
        t0 = time.perf_counter()
        ids = sample_clients(self.ctx.data.num_clients, self.k, self.ctx.seed, r)
        uploads, weights, losses = Rows(len(ids)), [], []
        self.abandonable = True
        up = down = 0
        for chunk in self.chunks(ids):
            cohort = self.ctx.cohort(chunk, r)
            payload = self.alg.configure(self.server, cohort).to(self.ctx.device)
            down += nbytes(payload.broadcast) * len(chunk) + nbytes(payload.per_client)
            result = self.alg.client_update(
                payload, self.store.take(chunk, self.ctx.device), cohort
            )
            check_client_state(result.state, chunk, r)
            self.abandonable = False  # from here on the round changes client state
            self.store.put(chunk, result.state)
            up += nbytes(result.upload)
            uploads.add(result.upload, len(chunk))  # copied: the chunk's can go
            weights.append(result.num_examples)
            losses.append(result.loss.detach().cpu())
        rest = torch.ones(self.ctx.data.num_clients, dtype=torch.bool)
        rest[ids] = False
        if self.alg.trains_unsampled and rest.any():  # local work of the clients not sampled
            for chunk in self.chunks(rest.nonzero().flatten()):
                state = self.store.take(chunk, self.ctx.device)
                cohort = self.ctx.cohort(chunk, r)
                state = self.alg.update_unsampled(self.server, state, cohort)
                check_client_state(state, chunk, r)
                self.store.put(chunk, state)
        return self.finish_round(r, ids, [uploads.result()], weights, losses, up, down, t0)

    def finish_round(
        self,
        r: int,
        ids: Tensor,
        uploads: list[Tree],
        weights: list[Tensor],
        losses: list[Tensor],
        up: int,
        down: int,
        t0: float,
    ) -> RoundRecord:
        """The server side of a round, once every sampled client's upload is in (stacked in
        ``ids`` order): fault containment, late uploads, aggregation, the round's record.
        Shared by the in-process runner and the Flower server."""
        self.abandonable = False
        upload = concat(uploads)  # not a copy for one chunk: contain_faults copies to corrupt
        w = torch.cat(weights).cpu().float()
        keep, events, upload = self.contain_faults(r, ids, upload, w)
        ids_in, w_in, upload_in = self.deliver(r, ids, w, upload, keep)
        rec_extras: dict = {}
        if len(ids_in):
            info = RoundInfo(ids_in, w_in, r)
            server = self.alg.aggregate(self.server, upload_in, info)
            self.server = to_device(server, self.ctx.device)
            rec_extras = plain(info.log)
            if not finite(self.server):
                raise NonFiniteState(r + 1)
        elif len(ids):
            events.append({"client": None, "event": "no-usable-upload"})
        loss = torch.cat(losses)
        ok = torch.isfinite(loss)
        # NaN when every client diverged (a 0.0 would read as a perfect fit)
        mean_loss = float((loss[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() else math.nan
        rec = RoundRecord(r + 1, mean_loss, up, down, time.perf_counter() - t0)
        rec.extras = {**rec_extras, **({"events": events} if events else {})}
        chosen = self.ctx.trainer.choices.report()
        if chosen:  # what execution = auto timed and chose this round (new objectives only)
            rec.extras["execution"] = chosen
        return rec

    def contain_faults(
        self, r: int, ids: Tensor, upload: Tree, weights: Tensor
    ) -> tuple[Tensor, list[dict], Tree]:
        """Apply injected faults (lost, late, corrupted uploads) and exclude uploads that are
        non-finite or of exploding norm. Returns which rows reach this round's aggregation,
        one event per affected client, and the uploads (a copy where one was corrupted:
        the given tensors may be the clients' own state); late uploads wait in
        ``self.pending``."""
        copied = False
        keep = torch.ones(len(ids), dtype=torch.bool)
        events: list[dict] = []
        for j, c in enumerate(ids.tolist()):
            kind = injected_fault(self.faults, self.ctx.seed, r, c)
            if kind is None:
                continue
            events.append({"client": c, "event": kind})
            if kind == "corrupted":
                if not copied:
                    upload, copied = tree_map(torch.clone, upload), True
                corrupt(upload, j)
            else:
                keep[j] = False
            if kind == "delayed":
                self.pending.append(
                    {
                        "due": r + self.faults.delay,
                        "sent": r,
                        "client": c,
                        "num_examples": float(weights[j]),
                        "upload": tree_map(lambda v, j=j: v[j].detach().cpu().clone(), upload),
                    }
                )
        for j, why in enumerate(screen(upload, self.faults)):
            if why is not None and keep[j]:
                keep[j] = False
                events.append({"client": int(ids[j]), "event": why})
        return keep, events, upload

    def deliver(
        self, r: int, ids: Tensor, w: Tensor, upload: Tree, keep: Tensor
    ) -> tuple[Tensor, Tensor, Tree]:
        """This round's usable uploads, followed by late uploads that arrive now (stale)."""
        due = [p for p in self.pending if p["due"] == r]
        self.pending = [p for p in self.pending if p["due"] != r]
        index = keep.nonzero().flatten()
        every = bool(keep.all())  # every upload usable: no gather (a pass over the uploads)
        parts = [upload if every else tree_map(lambda v: v[index.to(v.device)], upload)]
        ids_in = [ids[index]]
        w_in = [w[index]]
        dev = self.ctx.device
        for p in due:
            parts.append(tree_map(lambda v: v.unsqueeze(0).to(dev), p["upload"]))
            ids_in.append(torch.tensor([p["client"]]))
            w_in.append(torch.tensor([p["num_examples"]]))
        return torch.cat(ids_in), torch.cat(w_in), concat(parts)

    def counts(self, splits: dict[str, Split], round_: int) -> EvalCounts:
        """Every client's predictor on each split: correct and total [N, E], predicted and
        true class counts [N, K] summed over the splits."""
        n, k = self.ctx.data.num_clients, self.ctx.data.num_classes
        out = EvalCounts.zeros(n, len(splits), k)
        for chunk in self.chunks(torch.arange(n)):
            cohort = self.ctx.cohort(chunk, round_)
            pred = self.alg.predictor(self.server, self.store.take(chunk, self.ctx.device), cohort)
            for j, split in enumerate(splits.values()):
                c, t, guessed, saturated = prediction_counts(
                    self.ctx, pred.params, pred.buffers, pred.shared, split, chunk
                )
                out.correct[chunk, j] = c
                out.total[chunk, j] = t
                out.saturated[chunk, j] = saturated
                out.predicted[chunk] += guessed
                out.labels[chunk] += label_counts(split, chunk, k)
        return out

    def is_final(self, round_: int) -> bool:
        """Whether an evaluation after ``round_`` is the run's last (its reported one)."""
        return round_ >= self.rounds - 1

    def evaluate(self, round_: int) -> tuple[Tensor, dict, Tensor | None, float | None]:
        """Test (and validation) counts of every client's predictor; the last evaluation
        also scores the predictors on their own training rows, for the degeneracy check."""
        data = self.ctx.data
        test = self.counts(data.test, round_)
        acc, summary = test.summary(data.test_env_names)
        if self.is_final(round_):
            summary.update(training_fit(self.counts({"train": data.train}, round_)))
            flag_training_fit(summary)
        val_acc, val = None, None
        if data.val:
            val_acc = self.counts(data.val, round_).percent()
            val = summarize(val_acc, list(data.val))["average"]
        return acc, summary, val_acc, val

    def state_dict(self, result: RunResult, rounds_done: int) -> dict:
        """Everything needed to continue after ``rounds_done`` rounds (see checkpoint.py),
        and the final evaluation once there is one: a run killed after its last checkpoint
        but before the store recorded its results then resumes straight to them."""
        final = None
        if result.metrics and rounds_done == self.rounds:  # not a run extended on resume
            final = {
                "accuracy": result.accuracy,
                "metrics": result.metrics,
                "val_accuracy": result.val_accuracy,
            }
        return {
            "rounds_done": rounds_done,
            # flat "/"-joined names: a checkpoint reads without knowing the method's trees
            "server": {k: v.cpu() for k, v in flatten(self.server).items()},
            "clients": None
            if self.store.state is None
            else {k: v.cpu() for k, v in flatten(self.store.state).items()},
            "records": [dataclasses.asdict(r) for r in result.rounds],
            "time_s": result.time_s,
            "bytes_up": result.bytes_up,
            "bytes_down": result.bytes_down,
            "pending": self.pending,
            "final": final,
            "execution": self.ctx.trainer.choices.export(),  # auto's choices, kept on resume
        }

    def load_state_dict(self, state: dict) -> RunResult:
        template = self.store.template
        n = self.store.num_clients
        shapes = {k: (n, *v.shape) for k, v in flatten(template).items()}
        check_fit("client", state["clients"], shapes)
        check_fit("server", state["server"])  # its names and shapes may change (UCFL)
        dev = self.ctx.device
        server = to_device(unflatten(state["server"]), dev)
        self.server = empty_parts_like(server, self.server)  # self.server: the method's init
        if state["clients"] is not None:
            clients = {k: v.to(self.store.device) for k, v in state["clients"].items()}
            self.store.state = empty_parts_like(unflatten(clients), template)
        result = self.new_result()
        try:
            result.rounds = [RoundRecord(**r) for r in state["records"]]
        except TypeError as e:
            raise FedshiftError(f"the checkpoint's round records are damaged ({e})") from None
        result.time_s, result.bytes_up = state["time_s"], state["bytes_up"]
        result.bytes_down = state["bytes_down"]
        final = state.get("final")
        if final and state["rounds_done"] == self.rounds:  # else the run was extended
            try:
                result.accuracy, result.metrics = final["accuracy"], dict(final["metrics"])
                result.val_accuracy = final["val_accuracy"]
            except (KeyError, TypeError, ValueError):
                raise FedshiftError("the checkpoint's final results are damaged") from None
        self.start_round = state["rounds_done"]
        self.pending = list(state.get("pending", []))
        execution = state.get("execution") or {}
        if isinstance(execution, dict):
            self.ctx.trainer.choices.preload(execution)
        return result

    def final_evaluation(self, result: RunResult) -> None:
        """The last round's evaluation, redone from the restored state: for a checkpoint
        written after the last round by an older version, which kept no final results
        (evaluation is a pure function of the state, so the numbers are the same)."""
        acc, summary, val_acc, _ = self.evaluate(self.rounds - 1)
        flag_chance_loss(summary, [x.loss for x in result.rounds], self.ctx.data.num_classes)
        result.accuracy, result.metrics, result.val_accuracy = acc, summary, val_acc

    def new_result(self) -> RunResult:
        return RunResult(env_names=self.ctx.data.test_env_names, val_names=list(self.ctx.data.val))

    def run(self, result: RunResult | None = None) -> RunResult:
        """Train from ``self.start_round`` (0, or where a loaded checkpoint left off).

        After each round: evaluate when due, report the round, write a checkpoint every
        ``checkpoint_every`` rounds, and stop cleanly (checkpoint, then :class:`RunStopped`)
        when ``stop_requested`` was set, e.g. by a signal handler.
        """
        result = result or self.new_result()
        t_start = time.perf_counter() - result.time_s
        if self.start_round == 0:
            self.server = self.alg.before_training(self.server)
        lost = LostRounds(result.rounds)
        for r in range(self.start_round, self.rounds):
            try:
                rec = self.train_round(r)
            except TrainingAbandoned:  # stop requested mid-round, no state changed yet
                self.abandonable = False
                if self.checkpoint_path and r > 0:
                    state = {**self.checkpoint_meta, **self.state_dict(result, r)}
                    save_checkpoint(self.checkpoint_path, state)
                raise RunStopped(r) from None
            last = r == self.rounds - 1
            lost.add(rec)
            diverged = lost.verdict(self.rounds, last)
            if diverged is None and (last or (self.eval_every and (r + 1) % self.eval_every == 0)):
                acc, summary, val_acc, val = self.evaluate(r)
                rec.metrics, rec.val = summary, val
                if last:
                    losses = [x.loss for x in result.rounds] + [rec.loss]
                    flag_chance_loss(summary, losses, self.ctx.data.num_classes)
                    result.accuracy, result.metrics, result.val_accuracy = acc, summary, val_acc
            result.rounds.append(rec)
            result.bytes_up += rec.bytes_up
            result.bytes_down += rec.bytes_down
            result.time_s = time.perf_counter() - t_start
            if self.on_round:
                self.on_round(rec)
            if diverged is not None:  # recorded, but no checkpoint of a diverged state
                raise Diverged(r + 1, diverged)
            due = self.checkpoint_every and (r + 1) % self.checkpoint_every == 0
            if self.checkpoint_path and (due or last or self.stop_requested):
                state = {**self.checkpoint_meta, **self.state_dict(result, r + 1)}
                save_checkpoint(self.checkpoint_path, state)
            if self.stop_requested and not last:
                raise RunStopped(r + 1)
        if 0 < self.rounds <= self.start_round and not result.metrics:
            self.final_evaluation(result)
        if self.rounds == 0:
            result.accuracy, result.metrics, result.val_accuracy, _ = self.evaluate(0)
        result.time_s = time.perf_counter() - t_start
        result.server = self.server
        return result


def check_fit(what: str, saved, shapes: dict | None = None) -> None:
    """Refuse a checkpoint whose state is not a mapping of tensors, or (for client
    state, whose names and shapes are fixed by the method) does not fit this run, in one
    sentence rather than a shape error deep in training."""
    ok = isinstance(saved, dict) and all(isinstance(v, Tensor) for v in saved.values())
    if ok and shapes is not None:
        ok = set(saved) == set(shapes)
        ok = ok and all(tuple(v.shape) == tuple(shapes[k]) for k, v in saved.items())
    if not (ok or (saved is None and what == "client")):
        raise FedshiftError(
            f"the checkpoint's {what} state does not fit this run's model and method "
            "(another run's checkpoint?); it cannot continue this run"
        )


def plain(value):
    """Tensors and numpy values → Python numbers and lists, so a round's log is JSON."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def lost_round(rec: RoundRecord) -> bool:
    """Whether a round trained nothing for numerical reasons: every participant's loss was
    non-finite, or no upload reached aggregation and the numerical screen (non-finite or
    exploding norm) excluded at least one that no injected fault (``faults.drop`` / ``delay``
    / ``corrupt``) had already claimed. Rounds emptied by injected faults alone are the
    experiment the user asked for, not divergence."""
    if not math.isfinite(rec.loss):
        return True
    events = rec.extras.get("events", [])
    if not any(e["event"] == "no-usable-upload" for e in events):
        return False
    injected = {e["client"] for e in events if e["event"] in INJECTED}
    return any(e["event"] in SCREENED and e["client"] not in injected for e in events)


class LostRounds:
    """The rounds of a run so far that trained nothing (:func:`lost_round`), counted as
    they come, and whether that makes the run diverged (:meth:`verdict`)."""

    def __init__(self, records: list[RoundRecord] = ()) -> None:
        self.lost: list[RoundRecord] = []
        self.streak = 0
        self.seen = self.unaggregated = 0
        for rec in records:
            self.add(rec)

    def add(self, rec: RoundRecord) -> None:
        self.seen += 1
        events = rec.extras.get("events", [])
        self.unaggregated += any(e["event"] == "no-usable-upload" for e in events)
        if lost_round(rec):
            self.lost.append(rec)
            self.streak += 1
        else:
            self.streak = 0

    def verdict(self, rounds: int, last: bool = False) -> str | None:
        """Why the run has diverged, or None; at its ``last`` round also a run in which no
        round aggregated an upload (injected faults took every one): it trained nothing."""
        why = divergence(self.lost, self.streak >= DIVERGED_STREAK, rounds)
        if why is None and last and self.seen and self.unaggregated == self.seen:
            why = (
                f"none of its {self.seen} rounds aggregated an upload (injected faults dropped "
                "or delayed every one: faults.drop = 1 or faults.delay at least the rounds "
                "left), so the model never left its initialisation"
            )
        return why


def divergence(lost: list[RoundRecord], streak: bool, rounds: int) -> str | None:
    """Why a run has diverged, or None: of its ``rounds`` planned, more than
    DIVERGED_FRACTION are ``lost`` (trained nothing), or the last DIVERGED_STREAK were
    (``streak``)."""
    if len(lost) <= DIVERGED_FRACTION * rounds and not streak:
        return None
    events = [e["event"] for rec in lost for e in rec.extras.get("events", [])]
    how = (
        f"{DIVERGED_STREAK} rounds in a row"
        if streak
        else f"{len(lost)} of its {rounds} rounds (more than {DIVERGED_FRACTION:.0%})"
    )
    if events.count("norm") > events.count("nonfinite"):
        return (
            f"{how} had no usable upload because faults.max_norm excluded them as exploding; "
            "raise faults.max_norm (a multiple of the round's median norm: below 1 it excludes "
            "at least half of every round's uploads; 3 to 10 is usual)"
        )
    return (
        f"{how} trained nothing (non-finite training loss or every upload NaN/Inf); lower lr "
        "or the method's step sizes (algorithm.*)"
    )


def check_client_state(state: Tree, ids: Tensor, r: int) -> None:
    """Refuse to keep a client state with NaN/Inf: that client's personal model diverged."""
    tensors = [v for v in leaves(state) if v.is_floating_point()]
    if tensors:
        bad = ~finite_rows(*tensors)
        if bad.any():
            client = int(ids[bad.nonzero()[0, 0].to(ids.device)])
            raise Diverged(
                r + 1,
                f"client {client}'s personal state became non-finite (NaN/Inf); lower lr or "
                "the method's step sizes (algorithm.*)",
            )


class NonFiniteState(Diverged):
    """The server state became NaN/Inf after aggregation."""

    def __init__(self, round_: int) -> None:
        super().__init__(
            round_,
            "the global state became non-finite (NaN/Inf); lower lr or the method's step "
            "sizes (algorithm.*), or set faults.max_norm to exclude exploding client updates",
        )
