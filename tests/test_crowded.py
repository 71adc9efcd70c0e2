"""The crowded-machine hint: said when other processes fill every core and the run would
use several threads, never otherwise, and once per process where someone watches."""

from __future__ import annotations

import os

import pytest
import torch

from fedshift import crowded


@pytest.fixture
def machine(monkeypatch):
    def set_(load: float, cores: int = 2, threads: int = 2) -> None:
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load), raising=False)
        monkeypatch.setattr(crowded, "usable_cores", lambda: cores)
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)

    return set_


def test_a_full_machine_gets_the_hint(machine):
    machine(load=3.1)
    hint = crowded.crowded_hint(0, "cpu")
    assert "load 3.1 on 2 cores" in hint and "--set threads=1" in hint


@pytest.mark.parametrize(
    ("load", "threads_option", "intra_op", "device"),
    [
        (1.0, 0, 2, "cpu"),  # a core is free: PASSIVE copes (docs/performance.md)
        (3.1, 1, 2, "cpu"),  # the user chose the threads
        (3.1, 0, 1, "cpu"),  # one thread already
    ],
)
def test_no_hint_otherwise(machine, load, threads_option, intra_op, device):
    machine(load=load, threads=intra_op)
    assert crowded.crowded_hint(threads_option, device) is None


class Stop(Exception):
    pass


def test_the_cli_says_it_once_where_someone_watches(machine, monkeypatch, capsys):
    import fedshift.api
    import fedshift.jobs
    import fedshift.progress
    from fedshift.api import make_config
    from fedshift.jobs import Job, run_jobs

    machine(load=5.0)
    monkeypatch.setattr(fedshift.progress, "wanted", lambda progress: True)  # a terminal
    monkeypatch.setattr(fedshift.jobs, "_crowded_said", False)
    started = []

    def run(cfg, **kwargs):  # the runs themselves do not matter here
        started.append(cfg)
        if len(started) == 2:
            raise Stop

        class Out:
            run_id, metrics = "x", {}

            def summary(self):
                return {"val": None}

        return Out()

    monkeypatch.setattr(fedshift.api, "run", run)
    cfg = make_config(algorithm="fedavg", scenario="dirichlet", rounds=1)
    jobs = [Job(cfg, "a", data=None), Job(cfg, "b", data=None)]
    with pytest.raises(Stop):
        list(run_jobs(jobs, db=None, progress=lambda total, label: (None, None)))
    assert len(started) == 2
    assert capsys.readouterr().err.count("this machine is busy") == 1
    started.clear()
    list(run_jobs(jobs[:1], db=None, progress=lambda total, label: (None, None)))
    assert "busy" not in capsys.readouterr().err  # said once per process (a table's methods)
    monkeypatch.setattr(fedshift.jobs, "_crowded_said", False)
    started.clear()
    list(run_jobs(jobs[:1], db=None))  # no progress: no one watches, no hint
    assert "busy" not in capsys.readouterr().err
