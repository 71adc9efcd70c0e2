"""Plots a reader can trust: incomparable runs apart, whole-round ticks, no lines between
unordered environments, distributions for many clients, equal curves kept visible, a loss
curve, and seeds drawn as mean ± std. The figures are inspected as matplotlib objects."""

from __future__ import annotations

import json
import math

import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.patches import PathPatch
from matplotlib.ticker import MaxNLocator
from typer.testing import CliRunner

import fedshift as fs
from fedshift.cli import app
from fedshift.results.plots import (
    accuracy_curves_figure,
    clients_figure,
    env_sets_note,
    loss_figure,
    per_env_figure,
    series_of,
    styles,
)
from fedshift.results.report import run_label

P_ENVS = [f"p={p / 10:.1f}" for p in range(11)]


def fake_run(
    run_id: str,
    algorithm: str = "fedavg",
    seed: int = 0,
    envs: list[str] = P_ENVS,
    scenario: str = "digits-shortcut",
    clients: int = 8,
    rounds: int = 3,
    shift: float = 0.0,
    losses: list[float] | None = None,
    **config,
) -> dict:
    """A run record as the store returns it, with accuracies that depend on the seed."""
    per_env = {e: min(100.0, 10.0 + 7.0 * i + shift + 2.0 * seed) for i, e in enumerate(envs)}
    losses = losses or [2.3 / (k + 1) + 0.1 * seed for k in range(rounds)]
    return {
        "run_id": run_id,
        "algorithm": algorithm,
        "scenario": scenario,
        "seed": seed,
        "config": {"algorithm": algorithm, "scenario": scenario, "seed": seed, **config},
        "environment": {},
        "metrics": {
            "per_env": per_env,
            "worst": min(per_env.values()),
            "average": sum(per_env.values()) / len(per_env),
            "per_client": [30.0 + (c * 7 + seed) % 60 for c in range(clients)],
            "degenerate": False,
        },
        "round_metrics": [
            {
                "round": k + 1,
                "loss": losses[k],
                "bytes_up": 1000,
                "bytes_down": 1000,
                "metrics": {"average": 20.0 + 10 * k + seed, "worst": 10.0 + 5 * k + seed},
                "extras": {},
            }
            for k in range(rounds)
        ],
    }


def data_lines(ax) -> list:
    """The lines drawn for series (not the analytic-oracle rule)."""
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith(("_", "analytic"))]


def visible(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_round_axes_tick_at_whole_rounds():
    runs = [fake_run("a0", rounds=3), fake_run("b0", "fedprox", rounds=3)]
    series = series_of(runs, run_label)
    for fig in (accuracy_curves_figure(series, "round"), loss_figure(series)):
        fig.canvas.draw()
        for ax in visible(fig):
            locator = ax.xaxis.get_major_locator()
            assert isinstance(locator, MaxNLocator) and locator._integer
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_unordered_environments_are_markers_without_lines():
    named = [f"e{i:02d}" for i in range(20)]
    runs = [fake_run(f"r{i}", a, envs=named, scenario="scm") for i, a in enumerate("abc")]
    (ax,) = visible(per_env_figure(series_of(runs, run_label)))
    lines = data_lines(ax)
    assert len(lines) == 3 and all(ln.get_linestyle() == "None" for ln in lines)
    assert all(ln.get_marker() not in (None, "None", "") for ln in lines)
    # side by side, so that equal values stay visible, and every environment labelled
    assert len({tuple(ln.get_xdata()) for ln in lines}) == 3
    assert [t.get_text() for t in ax.get_xticklabels()] == named
    # an ordered numeric axis keeps its lines
    runs = [fake_run(f"r{i}", a) for i, a in enumerate("abc")]
    (ax,) = visible(per_env_figure(series_of(runs, run_label)))
    assert all(ln.get_linestyle() != "None" for ln in data_lines(ax))
    assert ax.get_xlabel().startswith("p ")


def test_many_unordered_environments_are_distributions():
    named = [f"e{i:03d}" for i in range(200)]
    runs = [fake_run(f"r{i}", a, envs=named, scenario="scm") for i, a in enumerate("ab")]
    (ax,) = visible(per_env_figure(series_of(runs, run_label)))
    assert not data_lines(ax)  # no 200 markers a run
    assert sum(isinstance(p, PathPatch) for p in ax.patches) == 2  # one box a run
    assert "200 test environments" in ax.get_xlabel()


def test_equal_curves_stay_visible():
    """Seven runs with the same accuracies: every one has its own marker, line style and
    colour, drawn smaller than the one below it, and the legend names the equality."""
    runs = [fake_run(f"r{i}", f"method{i}", lr=0.1 * (i + 1)) for i in range(7)]
    (ax,) = visible(per_env_figure(series_of(runs, run_label)))
    lines = data_lines(ax)
    assert len(lines) == 7
    assert len({ln.get_marker() for ln in lines}) == 7
    assert len({ln.get_color() for ln in lines}) == 7
    sizes = [ln.get_markersize() for ln in lines]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 7
    assert all(ln.get_markerfacecolor() == "none" for ln in lines)  # hollow: nested shows
    dashes = [repr(st["linestyle"]) for st in styles(7)[:6]]
    assert len(set(dashes)) == 6
    assert "same curve as method0 (r0)" in lines[1].get_label()
    assert "same curve" not in lines[0].get_label()


def test_distinct_curves_are_not_called_the_same():
    runs = [fake_run("a0", "fedavg"), fake_run("b0", "fedprox", shift=0.3, lr=0.2)]
    (ax,) = visible(per_env_figure(series_of(runs, run_label)))
    assert not any("same curve" in ln.get_label() for ln in data_lines(ax))


@pytest.mark.parametrize("clients", [8, 20])
def test_few_clients_are_bars(clients):
    runs = [fake_run(f"r{i}", f"m{i}", clients=clients, lr=i) for i in range(7)]
    (ax,) = visible(clients_figure(runs, [run_label(r) for r in runs]))
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(bars) == 7 and all(len(b) == clients for b in bars)


@pytest.mark.parametrize("clients", [21, 100])
def test_many_clients_are_distributions(clients):
    runs = [fake_run(f"r{i}", f"m{i}", clients=clients, lr=i) for i in range(7)]
    runs[0]["metrics"]["per_client"][5] = None  # a client without test data
    (ax,) = visible(clients_figure(runs, [run_label(r) for r in runs]))
    assert not [c for c in ax.containers if isinstance(c, BarContainer)]
    assert sum(isinstance(p, PathPatch) for p in ax.patches) == 7  # one box a run
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 7 and f"{clients - 1} clients" in labels[0]
    assert "no test data: client 5" in ax.get_title()
    # every client is a dot
    assert [len(c.get_offsets()) for c in ax.collections][1:] == [clients] * 6


def test_seeds_of_one_configuration_are_a_mean_with_a_std_band():
    seeds = [fake_run(f"s{k}", seed=k) for k in range(3)]
    other = fake_run("p0", "fedprox", mu=0.1)
    series = series_of([seeds[0], other, seeds[1], seeds[2]], run_label)
    assert [len(s.runs) for s in series] == [3, 1]
    assert "mean ± std of 3 seeds" in series[0].label and "s0, s1, s2" in series[0].label
    (ax,) = visible(per_env_figure(series))
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1  # the seed group only
    mean_line = data_lines(ax)[0]
    values = [r["metrics"]["per_env"]["p=0.0"] for r in seeds]  # 10, 12, 14
    assert mean_line.get_ydata()[0] == pytest.approx(12.0)
    ys = bands[0].get_paths()[0].vertices[:, 1]
    std = math.sqrt(sum((v - 12.0) ** 2 for v in values) / 2)  # sample std over seeds
    assert min(ys) == pytest.approx(12.0 - std) and std == pytest.approx(2.0)
    for fig in (accuracy_curves_figure(series, "round"), loss_figure(series)):
        for ax in visible(fig):
            assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 1


def test_seed_band_on_named_environments_is_error_bars():
    named = ["art", "photo", "sketch"]
    seeds = [fake_run(f"s{k}", seed=k, envs=named, scenario="pacs") for k in range(3)]
    (ax,) = visible(per_env_figure(series_of(seeds, run_label)))
    assert [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_runs_on_different_environments_get_separate_panels():
    shortcut = fake_run("aaaa", scenario="digits-shortcut")
    iid = fake_run("bbbb", envs=["test"], scenario="iid", **{"scenario.dataset": "digits"})
    assert env_sets_note([shortcut, fake_run("cccc", "fedprox")]) is None
    # same scenario, other test environments (another p_test), or another dataset
    assert env_sets_note([shortcut, fake_run("dddd", envs=P_ENVS[:3])]) is not None
    other_data = fake_run("eeee", **{"scenario.dataset": "fmnist"})
    assert env_sets_note([shortcut, other_data]) is not None
    note = env_sets_note([shortcut, iid])
    assert "not comparable" in note and "aaaa" in note and "bbbb" in note
    series = series_of([shortcut, iid], run_label)
    for fig in (per_env_figure(series), accuracy_curves_figure(series, "round")):
        axes = visible(fig)
        assert len(axes) >= 2 and "not comparable" in fig._suptitle.get_text()
        # no axis holds both runs
        for ax in axes:
            assert len({ln.get_label() for ln in data_lines(ax)}) <= 1
    # the iid run's one environment is not drawn at p = 0 of the shortcut's axis
    p_axis, test_axis = visible(per_env_figure(series))
    assert [ln.get_xdata()[0] for ln in data_lines(test_axis)] == [0]
    assert [t.get_text() for t in test_axis.get_xticklabels()] == ["test"]
    assert len(data_lines(p_axis)[0].get_xdata()) == 11


def test_loss_curve_plots_the_stored_losses_and_cuts_a_divergent_spike():
    a = fake_run("a0", rounds=6, losses=[2.3, 1.5, 1.0, 0.7, 0.5, 0.4])
    b = fake_run("b0", "fedsdr", rounds=6, losses=[1e7, 2.2, 2.2, 2.2, 2.2, 2.2], lr=1)
    (ax,) = visible(loss_figure(series_of([a, b], run_label)))
    lines = data_lines(ax)
    assert list(lines[0].get_ydata()) == [2.3, 1.5, 1.0, 0.7, 0.5, 0.4]
    assert ax.get_yscale() == "log"  # losses spanning decades
    assert ax.get_ylim()[1] < 10 and "fedsdr reaches 1e+07" in ax.get_title()


def test_report_and_compare_draw_loss_and_separate_incomparable_runs(tmp_path):
    db = tmp_path / "runs.db"
    common = dict(rounds=2, lr=0.1, batch_size=32, db=db)
    shortcut = fs.run(algorithm="fedavg", scenario="digits-shortcut", **common).run_id
    iid = fs.run(
        algorithm="fedavg", scenario="iid", **{"scenario.dataset": "digits"}, **common
    ).run_id
    out = tmp_path / "cmp"
    res = CliRunner().invoke(
        app, ["compare", shortcut, iid, "--db", str(db), "--out", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "note: these runs were tested on 2 different sets of environments" in text
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["environment_sets"] == [[shortcut], [iid]]
    assert summary["plot"] == str(out / "accuracy_per_env.png")
    names = sorted(p.rsplit("/", 1)[-1] for p in summary["plots"])
    assert names == sorted(
        ["accuracy_per_env.png", "accuracy_per_round.png", "loss_per_round.png"]
        + ["accuracy_per_client.png"]
    )
    assert all((out / n).stat().st_size > 0 for n in names)


def test_reproduction_plots_show_the_spread_over_seeds():
    """The reproduce report's per-environment plot draws each method's seeds as mean ± std,
    and the published-against-ours plot gives our numbers ±1 std error bars."""
    from fedshift.eval.metrics import over_seeds
    from fedshift.results.comparison import MethodResult
    from fedshift.results.reproduction import published_figure, seed_series
    from fedshift.tables import Method, Table

    results = []
    for name, shift in (("FedAvg", 0.0), ("Local", -5.0)):
        per_seed = [fake_run(f"{name}{k}", seed=k, shift=shift)["metrics"] for k in range(3)]
        mean, std = over_seeds(per_seed)
        method = Method(name, name.lower(), published={"worst": 10.0, "average": 50.0})
        results.append(MethodResult(method, [], per_seed, mean, std, mean["per_env"]))
    series = seed_series(results, "digits-shortcut")
    assert series[0].label == "FedAvg (mean ± std of 3 seeds)"
    (ax,) = visible(per_env_figure(series))
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 2
    table = Table("t", "t", "s", ["worst", "average"], {}, [r.method for r in results])
    (ax,) = published_figure(table, results).axes
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one a metric
    (caps,) = bars[0].lines[2]  # the vertical error bars of "worst"
    spans = sorted(seg[1][1] - seg[0][1] for seg in caps.get_segments())
    assert spans == pytest.approx([2 * results[0].std["worst"], 2 * results[1].std["worst"]])


def test_runs_on_data_built_in_python_are_seeds_only_of_the_same_data():
    """A scenario rebuilds its data from the seed, so its fingerprint differs by seed; data
    assembled in Python are the run's own, so runs on other data are not one series."""

    def on(data: dict, seed: int, run_id: str) -> dict:
        run = fake_run(run_id, seed=seed)
        run["environment"] = {"data": data}
        return run

    scenario = [on({"source": "scenario", "fingerprint": f"f{k}"}, k, f"s{k}") for k in range(2)]
    assert [len(s.runs) for s in series_of(scenario, run_label)] == [2]
    python = [on({"source": "python", "fingerprint": f"f{k}"}, k, f"p{k}") for k in range(2)]
    assert [len(s.runs) for s in series_of(python, run_label)] == [1, 1]
    same = [on({"source": "python", "fingerprint": "f"}, k, f"q{k}") for k in range(2)]
    assert [len(s.runs) for s in series_of(same, run_label)] == [2]
