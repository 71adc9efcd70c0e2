"""Ray starts its workers at niceness 15 unless told otherwise; fedshift's ClientApp actors
do all the training of a Flower simulation, so ``simulate`` asks Ray for the starting
process's niceness (``RAY_ENV``). Without it, beside two one-thread training jobs on two
cores, this suite's simulation test stalled past 600 s (actor at ~5 % CPU); with it, 101 s."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("flwr")

from fedshift.flower.run import RAY_ENV  # noqa: E402


@pytest.fixture
def ray_with_our_env(monkeypatch):
    folder = tempfile.mkdtemp(prefix="fsray", dir="/tmp")  # Ray's socket paths are short
    for k, v in {**RAY_ENV, "RAY_TMPDIR": folder}.items():
        monkeypatch.setenv(k, v)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def test_ray_workers_run_at_the_niceness_of_the_process_that_starts_them(ray_with_our_env):
    @ray.remote(num_cpus=1)
    class Actor:  # as Flower's ClientApp actors
        def niceness(self) -> int:
            return os.nice(0)

    assert ray.get(Actor.remote().niceness.remote()) == os.nice(0)
