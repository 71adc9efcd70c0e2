"""``fedshift flower …``: run fedshift configs on Flower. ``fedshift flower run`` takes the
options of ``fedshift run`` (source, --method, --set, --rounds, --seed, --seeds,
--cohort-size, --db, --json, --device, --data-dir, --import) and prints the same table and
JSON summary; it adds the
Flower engine (--simulation or --deployment) and its connection settings. Flower itself is
imported only when a command runs, so ``fedshift`` works without the extra."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from .. import cli_output as output
from ..cli_once import OnceCommand
from ..cli_options import (
    DataDirOption,
    DbOption,
    DeviceOption,
    ImportOption,
    JsonOption,
    MethodOption,
    RoundsOption,
    SeedOption,
    SeedsOption,
    SetOption,
    SourceArgument,
    import_first,
)
from ..errors import FedshiftError
from ..results.store import DEFAULT_DB

app = typer.Typer(
    no_args_is_help=True,
    help="Run fedshift algorithms on Flower (simulation engine or SuperLink/SuperNodes).",
)


@app.command("run", cls=OnceCommand)
def run(
    source: SourceArgument = None,
    method: MethodOption = None,
    set_: SetOption = None,
    rounds: RoundsOption = None,
    seed: SeedOption = None,
    seeds: SeedsOption = None,
    cohort_size: Annotated[
        int | None, typer.Option(help="clients configured together per round (0 = all)")
    ] = None,
    db: DbOption = DEFAULT_DB,
    json_: JsonOption = False,
    device: DeviceOption = None,
    data_dir: DataDirOption = None,
    simulation: Annotated[
        bool, typer.Option("--simulation", help="Flower's simulation engine, in this process")
    ] = False,
    deployment: Annotated[
        bool, typer.Option("--deployment", help="a running SuperLink with one SuperNode/client")
    ] = False,
    superlink: Annotated[
        str | None, typer.Option(help="deployment: SuperLink connection in $FLWR_HOME/config.toml")
    ] = None,
    address: Annotated[
        str | None, typer.Option(help="deployment: SuperLink address HOST:PORT")
    ] = None,
    root_certificates: Annotated[
        Path | None, typer.Option(help="deployment: CA certificate (PEM) of the SuperLink's TLS")
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="deployment: no TLS (local tests only)")
    ] = False,
    actors: Annotated[
        int, typer.Option(help="simulation: Ray workers running ClientApps (0 = CPU cores)")
    ] = 0,
    round_timeout: Annotated[
        float, typer.Option(help="seconds to wait for every node's reply in a round")
    ] = 600.0,
    connect_timeout: Annotated[
        float,
        typer.Option(
            help="seconds to wait for every node's first answer (each loads torch and its "
            "data then: raise it on a busy machine)"
        ),
    ] = 120.0,
    imports: ImportOption = None,
) -> None:
    """Run one experiment (or one per seed) on Flower and record it in the run store."""
    try:
        _run(
            source, method, set_, rounds, seed, seeds, cohort_size, db, json_, device,
            data_dir, simulation, deployment, superlink, address, root_certificates, insecure,
            actors, round_timeout, connect_timeout, imports,
        )  # fmt: skip
    except FedshiftError as e:
        output.err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        output.err.print("interrupted; the run store keeps the rounds finished so far")
        raise typer.Exit(130) from None


def _run(
    source, method, set_, rounds, seed, seeds, cohort_size, db, json_, device, data_dir,
    simulation, deployment, superlink, address, root_certificates, insecure, actors,
    round_timeout, connect_timeout, imports,
) -> None:  # fmt: skip
    from ..config import command_configs
    from ..tables import table_row
    from . import require_flower

    if simulation == deployment:
        raise FedshiftError("choose one Flower engine: --simulation or --deployment")
    for name, value in (("--round-timeout", round_timeout), ("--connect-timeout", connect_timeout)):
        if not value > 0:
            raise FedshiftError(f"{name} must be a positive number of seconds, got {value}")
    if simulation and (superlink or address or root_certificates or insecure):
        raise FedshiftError(
            "--superlink/--address/--root-certificates/--insecure need --deployment"
        )
    require_flower()
    specs = import_first(imports)  # the nodes import the recorded specs again
    row = table_row(source, method)  # a paper table's method, else None
    if row is not None and row.table.scenario_seed is not None:
        raise FedshiftError(
            f"table {row.table.id} builds every seed's scenario with scenario_seed "
            f"{row.table.scenario_seed}, and Flower's nodes build it with the run seed; "
            f"run it with fedshift run {source} --method {method!r}"
        )
    configs = command_configs(
        source,
        set_,
        {
            "rounds": rounds,
            "seed": seed,
            "cohort_size": cohort_size,
            "device": device,
            "data_dir": data_dir,
            "imports": specs,
        },
        seeds,
        build=row.config if row else None,
    )
    _validate(configs)
    progress = _Progress(configs, "Flower " + ("simulation" if simulation else "deployment"))
    try:
        if simulation:
            from .run import simulate

            outcomes = simulate(
                configs,
                db=db,
                actors=actors,
                round_timeout=round_timeout,
                connect_timeout=connect_timeout,
                on_round=progress,
            )
            summaries = [o.summary() for o in outcomes]
        else:
            from .run import deploy

            summaries = deploy(
                configs,
                db=db,
                superlink=superlink,
                address=address,
                root_certificates=root_certificates,
                insecure=insecure,
                round_timeout=round_timeout,
                connect_timeout=connect_timeout,
                on_line=progress.line,
            )
    finally:
        progress.stop()
    name = f"{row.method.name} ({row.table.id})" if row else None
    output.print_run_summary(summaries, db, json_, name=name)


def _validate(configs) -> None:
    """Algorithm and scenario option errors before Flower starts (the nodes would hit them
    later)."""
    from ..experiment import check_options

    for cfg in configs:
        check_options(cfg)


class _Progress:
    """One progress bar per run, fed by round records (simulation) or by the deployed
    ServerApp's ``fedshift-round`` log lines (deployment)."""

    def __init__(self, configs, engine: str) -> None:
        self.configs, self.engine = configs, engine
        self.index = -1
        self.bar = self.update = None

    def __call__(self, index: int, rec) -> None:
        if index != self.index:
            self.stop()
            cfg = self.configs[index]
            label = f"{cfg.algorithm} on {cfg.scenario} (seed {cfg.seed}, {self.engine})"
            self.bar, self.update = output.progress_bar(cfg.rounds, label)
            self.index = index
        self.update(rec)

    def line(self, text: str) -> None:
        from .apps import ROUND_PREFIX

        if ROUND_PREFIX in text:
            d = json.loads(text.split(ROUND_PREFIX, 1)[1])
            metrics = {"average": d["acc"]} if d["acc"] is not None else None
            self(d["index"], _Round(d["round"], d["loss"], metrics))

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class _Round:
    def __init__(self, round_: int, loss: float, metrics: dict | None) -> None:
        self.round, self.loss, self.metrics = round_, loss, metrics
