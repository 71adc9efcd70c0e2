"""The ServerApp's discovery of SuperNodes (``fedshift.flower.server.discover``) says which
clients did not answer, within what time, and what to raise: a fake Grid, no Flower run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

from fedshift.flower import server  # noqa: E402
from fedshift.flower.server import NodeFailure, discover  # noqa: E402


@pytest.fixture(autouse=True)
def no_flower_run(monkeypatch):
    """Flower's Message needs a run's identity; the fake Grid reads none of it."""
    monkeypatch.setattr(server, "Message", lambda *args, **kwargs: None)


class FakeGrid:
    """Nodes 11, 12, 13 connected; only those in ``answering`` reply to the query."""

    def __init__(self, answering: dict[int, int], partitions: int = 3):
        self.answering, self.partitions = answering, partitions

    def get_node_ids(self):
        return [11, 12, 13]

    def send_and_receive(self, messages, timeout):
        for node, cid in self.answering.items():
            node_info = {"partition-id": cid, "num-partitions": self.partitions}
            yield SimpleNamespace(
                metadata=SimpleNamespace(src_node_id=node),
                has_error=lambda: False,
                content=SimpleNamespace(metric_records={"node": node_info}),
            )


def test_discover_maps_every_node_to_its_client():
    nodes = discover(FakeGrid({11: 2, 12: 0, 13: 1}), 3, timeout=5)
    assert nodes.of_client == {2: 11, 0: 12, 1: 13}


def test_discover_names_the_silent_clients_and_the_timeout_to_raise():
    with pytest.raises(NodeFailure) as err:
        discover(FakeGrid({12: 0}), 3, timeout=5)
    text = str(err.value)
    assert "clients [1, 2]" in text and "within 5 s" in text
    assert "--connect-timeout" in text and "fedshift-connect-timeout" in text


def test_serve_waits_the_connect_timeout_it_is_given():
    """``serve`` (the simulation's and the deployed app's server) hands its connect timeout
    to the discovery: with one node answering of three, it fails after that many seconds."""
    import fedshift as fs

    cfg = fs.make_config(algorithm="fedavg", scenario="digits-shortcut", rounds=1)
    cfg.scenario_options["clients"] = 3
    with pytest.raises(NodeFailure, match="within 2 s"):
        server.serve(FakeGrid({12: 0}), [cfg], db=None, engine="test", connect_timeout=2)


def test_cli_passes_connect_timeout_to_the_simulation(monkeypatch):
    """``fedshift flower run --connect-timeout S``: the simulation waits S seconds for its
    nodes (a busy machine needs more than the default 120 to start them); not positive, one
    sentence."""
    from typer.testing import CliRunner

    from fedshift.cli import app
    from fedshift.flower import run

    seen = {}

    def fake_simulate(configs, **kwargs):
        seen.update(kwargs)
        raise server.NodeFailure("stop here")

    monkeypatch.setattr(run, "simulate", fake_simulate)
    args = ["flower", "run", "--simulation", "--rounds", "1", "--set", "scenario=digits-shortcut"]
    out = CliRunner().invoke(app, [*args, "--connect-timeout", "300"])
    assert seen["connect_timeout"] == 300 and seen["round_timeout"] == 600
    out = CliRunner().invoke(app, [*args, "--connect-timeout", "0"])
    assert out.exit_code == 2 and "--connect-timeout must be a positive number" in out.output


def test_discover_refuses_a_node_started_for_another_scenario():
    with pytest.raises(NodeFailure, match="num-partitions=4"):
        discover(FakeGrid({11: 0, 12: 1, 13: 2}, partitions=4), 3, timeout=5)
