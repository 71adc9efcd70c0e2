"""The ServerApp side: fedshift's round loop with the clients on Flower SuperNodes.

:class:`FlowerRunner` is the in-process :class:`~fedshift.engine.runner.Runner` with two
steps replaced, in the same order: per round it samples clients with (seed, round), splits
them into the same cohorts, calls ``configure`` per cohort and sends each sampled client's
payload (broadcast + its own per-client row) to that client's node as a Flower ``train``
message; the uploads come back, are stacked in sampled-id order and go to ``aggregate``.
A method whose clients also train when not sampled (``trains_unsampled``: pFedMe, FedSDR)
sends the others the server state in a ``train`` message without a payload; they run
``update_unsampled`` on their own state and upload nothing (as in-process, this local work
is not counted as communication).
Evaluation sends the server state to every node (``evaluate`` messages); each node builds
its client's predictor from it and its own persistent state and counts correct predictions
per environment; the counts make the same [N, E] accuracy matrix and summary as in-process.

A node that fails or does not answer within the round timeout stops the run with
:class:`NodeFailure` (the run store marks the run failed with that message and keeps the
rounds completed): continuing without it would silently change every later number.
"""

from __future__ import annotations

import json
import secrets
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from ..api import RunOutcome, _open_tracking, _recorder
from ..config import RunConfig
from ..engine.runner import RoundRecord, Runner
from ..engine.sampling import sample_clients
from ..engine.tree import Tree, nbytes
from ..errors import Diverged, FedshiftError
from ..eval.metrics import EvalCounts, flag_training_fit, summarize, training_fit
from ..experiment import Experiment, build_experiment, environment_info
from ..results.store import DEFAULT_DB, RunStore
from .records import from_record, job_record, row, to_record

SUMMARY_PREFIX = "fedshift-summary "
DEFAULT_ROUND_TIMEOUT = 600.0
DEFAULT_CONNECT_TIMEOUT = 120.0


class NodeFailure(FedshiftError):
    """A SuperNode failed or did not answer; the run stops (see module docstring)."""


@dataclass
class Nodes:
    """Which Flower node holds which fedshift client."""

    of_client: dict[int, int] = field(default_factory=dict)  # client id → node id

    def client_of(self, node: int) -> int | None:
        return next((c for c, n in self.of_client.items() if n == node), None)


def discover(grid: Grid, num_clients: int, timeout: float) -> Nodes:
    """Wait for the SuperNodes and ask each for its partition (= client id)."""
    deadline = time.monotonic() + timeout
    while True:
        ids = sorted(grid.get_node_ids())
        if len(ids) >= num_clients:
            break
        if time.monotonic() > deadline:
            raise NodeFailure(
                f"only {len(ids)} of {num_clients} SuperNodes connected within {timeout:.0f} s;"
                f" start one SuperNode per client with --node-config "
                f'"partition-id=I num-partitions={num_clients}"'
            )
        time.sleep(0.2)
    messages = [Message(RecordDict(), dst_node_id=i, message_type="query") for i in ids]
    nodes = Nodes()
    for rep in grid.send_and_receive(messages, timeout=max(deadline - time.monotonic(), 30)):
        node = rep.metadata.src_node_id
        if rep.has_error():
            raise NodeFailure(f"SuperNode {node} failed to report its partition: {_reason(rep)}")
        info = rep.content.metric_records["node"]
        cid, n = int(info["partition-id"]), int(info["num-partitions"])
        if n != num_clients:
            raise NodeFailure(
                f"SuperNode {node} was started with num-partitions={n} but the scenario has"
                f" {num_clients} clients"
            )
        if cid in nodes.of_client:
            raise NodeFailure(f"two SuperNodes were started with partition-id={cid}")
        nodes.of_client[cid] = node
    missing = sorted(set(range(num_clients)) - set(nodes.of_client))
    if missing:
        raise NodeFailure(
            f"no SuperNode answered for clients {missing} within {timeout:.0f} s; each loads"
            " torch and its data on its first message, which takes longer on a busy machine:"
            " raise the connect timeout (fedshift flower run --connect-timeout SECONDS;"
            " connect_timeout= of fedshift.flower.run.simulate and deploy; the run config's"
            " fedshift-connect-timeout for a deployed app)"
        )
    return nodes


def _reason(reply: Message) -> str:
    reason = (reply.error.reason or "").strip() or f"error code {reply.error.code}"
    return reason.splitlines()[-1][:300]


class FlowerRunner(Runner):
    """The in-process round loop, with client work sent to Flower nodes."""

    def __init__(
        self,
        exp: Experiment,
        grid: Grid,
        nodes: Nodes,
        job: str,
        round_timeout: float = DEFAULT_ROUND_TIMEOUT,
    ) -> None:
        r = exp.runner
        super().__init__(
            exp.algorithm,
            exp.ctx,
            rounds=r.rounds,
            participation=1.0,
            clients_per_round=r.k,
            eval_every=r.eval_every,
            on_round=r.on_round,
            faults=r.faults,
        )
        self.config = exp.config
        self.grid = grid
        self.nodes = nodes
        self.job = job
        self.round_timeout = round_timeout

    def _message(self, content: RecordDict, client: int, kind: str, round_: int) -> Message:
        content["job"] = job_record(self.job, self.config, round_, client)
        return Message(
            content,
            dst_node_id=self.nodes.of_client[client],
            message_type=kind,
            group_id=f"{self.job}/{round_}",
        )

    def exchange(self, messages: list[Message], kind: str, round_: int) -> dict[int, Message]:
        """Send, wait for every reply; client id → reply, or :class:`NodeFailure`."""
        replies = list(self.grid.send_and_receive(messages, timeout=self.round_timeout))
        # the grid sets each sent message's id; a reply names the message it answers (an
        # error the SuperLink writes for a dead node comes from the SuperLink, not the node)
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        out: dict[int, Message] = {}
        problems = []
        for rep in replies:
            node = sent.get(rep.metadata.reply_to_message_id, rep.metadata.src_node_id)
            client = self.nodes.client_of(node)
            if rep.has_error():
                problems.append(f"client {client} (SuperNode {node}) failed: {_reason(rep)}")
            elif client is not None:
                out[client] = rep
        for m in messages:
            client = self.nodes.client_of(m.metadata.dst_node_id)
            if client not in out and not any(p.startswith(f"client {client} ") for p in problems):
                problems.append(
                    f"client {client} (SuperNode {m.metadata.dst_node_id}) did not answer"
                    f" within {self.round_timeout:.0f} s"
                )
        if problems:
            raise NodeFailure(f"round {round_ + 1} ({kind}): " + "; ".join(problems))
        return out

    def train_round(self, r: int) -> RoundRecord:
        t0 = time.perf_counter()
        ids = sample_clients(self.ctx.data.num_clients, self.k, self.ctx.seed, r)
        messages = []
        down = 0
        for chunk in self.chunks(ids):
            cohort = self.ctx.cohort(chunk, r)
            payload = self.alg.configure(self.server, cohort)
            down += nbytes(payload.broadcast) * len(chunk) + nbytes(payload.per_client)
            for j, client in enumerate(chunk.tolist()):
                content = RecordDict(
                    {
                        "broadcast": to_record(payload.broadcast),
                        "per_client": to_record(row(payload.per_client, j)),
                    }
                )
                messages.append(self._message(content, client, "train", r))
        if self.alg.trains_unsampled:  # local work of the others: the server state, no upload
            sampled = set(ids.tolist())
            server = to_record(self.server)  # converted once, sent to each of them
            for client in range(self.ctx.data.num_clients):
                if client not in sampled:
                    content = RecordDict({"server": server})
                    messages.append(self._message(content, client, "train", r))
        replies = self.exchange(messages, "train", r)
        uploads: list[Tree] = []
        weights, losses = [], []
        times: dict[str, list[float]] = {"t_startup": [], "t_build": [], "t_update": []}
        up = 0
        for client in ids.tolist():
            content = replies[client].content
            upload = from_record(content.array_records.get("upload"), self.ctx.device)
            metrics = content.metric_records["result"]
            up += nbytes(upload)
            uploads.append(upload)
            weights.append(torch.tensor([metrics["num_examples"]], dtype=torch.float32))
            losses.append(torch.tensor([metrics["loss"]], dtype=torch.float32))
            for k, v in times.items():
                v.append(float(metrics.get(k, 0.0)))
        # from here on exactly the in-process round (faults, late uploads, aggregation)
        rec = self.finish_round(r, ids, uploads, weights, losses, up, down, t0)
        # where the round's time went on the nodes (mean over the sampled clients)
        rec.extras["flower"] = {k[2:] + "_s": round(sum(v) / len(v), 4) for k, v in times.items()}
        return rec

    def evaluate(self, round_: int) -> tuple[torch.Tensor, dict, torch.Tensor | None, float | None]:
        data = self.ctx.data
        n = data.num_clients
        messages = [
            self._message(RecordDict({"server": to_record(self.server)}), c, "evaluate", round_)
            for c in range(n)
        ]
        replies = self.exchange(messages, "evaluate", round_)

        def gathered(name: str, width: int) -> EvalCounts:
            out = EvalCounts.zeros(n, width, data.num_classes)
            for c in range(n):
                counts = replies[c].content.metric_records["counts"]
                for part in ("correct", "total", "predicted", "labels", "saturated"):
                    row = torch.tensor(counts[f"{name}.{part}"], dtype=torch.int64)
                    getattr(out, part)[c] = row
            return out

        acc, summary = gathered("test", len(data.test)).summary(data.test_env_names)
        if self.is_final(round_):  # the nodes scored their own training rows too
            summary.update(training_fit(gathered("train", 1)))
            flag_training_fit(summary)
        val_acc, val = None, None
        if data.val:
            val_acc = gathered("val", len(data.val)).percent()
            val = summarize(val_acc, list(data.val))["average"]
        return acc, summary, val_acc, val


def serve(
    grid: Grid,
    configs: list[RunConfig],
    *,
    db: str | None,
    engine: str,
    round_timeout: float = DEFAULT_ROUND_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    on_round: Callable[[int, RoundRecord], None] | None = None,
    on_outcome: Callable[[RunOutcome], None] | None = None,
) -> list[RunOutcome]:
    """Run each config to the end on the grid's nodes, recording each in the run store.

    The same SuperNodes serve every config (their per-client state is kept per run). A
    failure marks the run failed in the store (with the rounds completed) and propagates.
    """
    import flwr

    store = RunStore(db) if db else None
    nodes: Nodes | None = None
    outcomes = []
    for index, cfg in enumerate(configs):
        holder: dict[str, str] = {}

        def report(rec: RoundRecord, index=index) -> None:
            if on_round is not None:
                on_round(index, rec)

        exp = build_experiment(cfg, on_round=_recorder(store, holder, report))
        if nodes is None:
            nodes = discover(grid, exp.data.num_clients, connect_timeout)
        elif len(nodes.of_client) != exp.data.num_clients:
            raise FedshiftError("every config of one Flower run must have the same client count")
        if store is not None:
            env = environment_info(exp.ctx.device)
            env.update(engine=engine, flwr=flwr.__version__)
            holder["run_id"] = store.start(cfg.flat(), env)
        run_id = holder.get("run_id")
        base = store.path.parent if store is not None else DEFAULT_DB.parent
        tracking = holder["tracking"] = _open_tracking(store, run_id, cfg.flat(), base, [])
        runner = FlowerRunner(exp, grid, nodes, run_id or secrets.token_hex(5), round_timeout)
        try:
            result = runner.run()
        except BaseException as e:
            status = "diverged" if isinstance(e, Diverged) else "failed"
            if store is not None:
                msg = "".join(traceback.format_exception_only(e)).strip()
                store.fail(run_id, status, msg)
            if tracking is not None:
                tracking.close(status)
            raise
        outcome = RunOutcome(run_id, cfg, result)
        if store is not None:
            store.finish(run_id, result, outcome.summary()["val"])
        if tracking is not None:
            tracking.finish(result.metrics)
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return outcomes


def summary_line(outcome: RunOutcome) -> str:
    """The line a deployed ServerApp prints so ``fedshift flower run`` can read it back."""
    return SUMMARY_PREFIX + json.dumps(outcome.summary())
