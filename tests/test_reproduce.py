"""`fedshift reproduce`: tables as data, every method on the same partitions, report with
published beside ours and the ordering compared; a tiny table end to end on digits-shortcut."""

from __future__ import annotations

import json
import re

import pytest
from toy import power_cut_at
from typer.testing import CliRunner

from fedshift.cli import app
from fedshift.errors import FedshiftError
from fedshift.reproduce import reproduce
from fedshift.results.store import RunStore
from fedshift.tables import load_table, table_names

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

TINY = """
[table]
id = "tiny"
title = "four methods on digits-shortcut"
source = "a test table"
metrics = ["worst", "average"]
seeds = 2
gap = 5.0

[run]
rounds = 2
lr = 0.05
batch_size = 20
local_steps = 3

[run.scenario]
name = "digits-shortcut"
clients = 4

[quick]
rounds = 1

[[method]]
name = "FedAvg"
algorithm = "fedavg"
published = { worst = 10.0, average = 50.0 }

[[method]]
name = "FedProx"
algorithm = "fedprox"
options = { mu = 0.1 }
published = { worst = 12.0, average = 52.0 }

[[method]]
name = "Local"
algorithm = "local"
published = { worst = 30.0, average = 40.0 }

[[method]]
name = "FTFA"
algorithm = "ftfa"
set = { lr = 0.1 }
published = { worst = 20.0, average = 60.0 }
"""

# the first two methods only, for the tests of the mechanics (fewer runs)
TWO = TINY[: TINY.index('[[method]]\nname = "Local"')]


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_tiny_table_end_to_end(tiny, tmp_path):
    db = tmp_path / "runs.db"
    out = reproduce(str(tiny), db=db, out_dir=tmp_path / "report")
    assert [m["name"] for m in out["methods"]] == ["FedAvg", "FedProx", "Local", "FTFA"]
    store = RunStore(db)
    runs = {r["run_id"]: r for r in store.runs()}
    assert len(runs) == 8  # 4 methods × 2 seeds, all recorded
    for m in out["methods"]:
        assert len(m["run_ids"]) == 2
        seeds = sorted(runs[r]["seed"] for r in m["run_ids"])
        assert seeds == [0, 1]
        assert 0.0 <= m["ours"]["worst"] <= m["ours"]["average"] <= 100.0
    # same partitions: for one seed every method saw the same client sizes
    fedavg0 = store.run(out["methods"][0]["run_ids"][0])
    local0 = store.run(out["methods"][2]["run_ids"][0])
    assert fedavg0["config"]["scenario.clients"] == local0["config"]["scenario.clients"] == 4
    assert (
        fedavg0["config"]["lr"] == 0.05
        and store.run(out["methods"][3]["run_ids"][0])["config"]["lr"] == 0.1
    )
    assert store.run(out["methods"][1]["run_ids"][0])["config"]["algorithm.mu"] == 0.1
    # ordering comparison
    comp = out["comparison"]
    assert set(comp) == {"worst", "average"}
    for c in comp.values():
        assert c["methods"] == 4 - len(c["degenerate"])
        if c["methods"] >= 3:
            assert -1.0 <= c["spearman"] <= 1.0 and -1.0 <= c["kendall"] <= 1.0
        assert len(c["published_order"]) == 4
    gaps = comp["average"]["gaps"]  # published averages 60, 52, 50, 40: gaps ≥ 5
    pairs = {(g["better"], g["worse"]) for g in gaps}
    assert pairs == {
        ("FTFA", "FedProx"),
        ("FTFA", "FedAvg"),
        ("FTFA", "Local"),
        ("FedProx", "Local"),
        ("FedAvg", "Local"),
    }
    ours = {m["name"]: m["ours"]["average"] for m in out["methods"]}
    for g in gaps:  # two seeds are too few to tell a gap from seed noise: none can hold
        assert g["our_gap"] == pytest.approx(ours[g["better"]] - ours[g["worse"]], abs=0.01)
        assert g["status"] in ("untested", "degenerate") and not g["holds"]
    # the report: published beside ours, the ordering, the plots
    text = (tmp_path / "report" / "report.md").read_text()
    assert "worst (published)" in text and "worst (ours)" in text
    assert "| FedAvg | `fedavg` | 10.0 |" in text
    assert re.search(r"\| FedAvg \| `fedavg` \| 10\.0 \| \d+\.\d ± \d+\.\d \| 50\.0 \|", text)
    assert "Spearman" in text and "Kendall" in text and "Published order: FTFA > FedProx" in text
    assert "held beyond seed noise: 0 of 5" in text
    for f in ("accuracy_per_env.png", "published_vs_ours.png", "runs/report.md"):
        assert (tmp_path / "report" / f).is_file()
    # what the models are: each seed's fit to its own training rows, one-class clients,
    # blown-up logits, from the stored runs, so a worst case bought with weak models shows
    fedavg = [runs[r]["metrics"] for r in out["methods"][0]["run_ids"]]
    fit = ", ".join(f"{m['train_accuracy_pooled']:.1f}" for m in fedavg)
    share = ", ".join(f"{m['train_majority_share']:.1f}" for m in fedavg)  # seeds differ here
    constant = ", ".join(str(m["constant_clients"]) for m in fedavg)
    assert f"| FedAvg | {fit} ({share}) | {constant} | " in text


def test_a_diverged_method_is_reported_and_the_table_goes_on(tmp_path):
    """FedProx at lr 1e30 diverges on every seed: the table still runs FedAvg, lists
    FedProx with no numbers and the reason, and never counts a gap with it as held."""
    path = tmp_path / "two.toml"
    path.write_text(
        TWO.replace("options = { mu = 0.1 }", "options = { mu = 0.1 }\nset = { lr = 1e30 }")
    )
    db = tmp_path / "runs.db"
    out = reproduce(str(path), db=db, out_dir=tmp_path / "report")
    fedavg, fedprox = out["methods"]
    assert fedavg["ours"]["worst"] is not None and not fedavg["degenerate"]
    assert fedprox["ours"]["worst"] is None and fedprox["degenerate"]
    status = {r["run_id"]: r["status"] for r in RunStore(db).runs()}
    assert [status[r] for r in fedprox["run_ids"]] == ["diverged", "diverged"]
    assert all(not g["holds"] for c in out["comparison"].values() for g in c["gaps"])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "diverged in round" in text
    assert (tmp_path / "report" / "accuracy_per_env.png").is_file()


def test_missing_algorithms_are_listed_or_skipped(tmp_path):
    text = (
        TWO
        + """
[[method]]
name = "Future"
algorithm = "not-yet-a-method"
published = { worst = 1.0, average = 2.0 }

[[method]]
name = "Other"
algorithm = "another-missing"
published = { worst = 1.0, average = 2.0 }
"""
    )
    path = tmp_path / "future.toml"
    path.write_text(text)
    with pytest.raises(FedshiftError) as err:
        reproduce(str(path), db=tmp_path / "r.db", out_dir=tmp_path / "o")
    msg = str(err.value)
    assert "another-missing, not-yet-a-method" in msg and "--skip-missing" in msg
    assert "\n" not in msg
    assert not (tmp_path / "r.db").exists() or RunStore(tmp_path / "r.db").runs() == []
    out = reproduce(
        str(path), db=tmp_path / "r.db", out_dir=tmp_path / "o", quick=True, skip_missing=True
    )
    assert out["skipped"] == ["Future", "Other"]
    assert [m["name"] for m in out["methods"]] == ["FedAvg", "FedProx"]
    assert "not registered, skipped" in (tmp_path / "o" / "report.md").read_text()


def test_bad_option_fails_before_any_run(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(TINY.replace("options = { mu = 0.1 }", "options = { nu = 0.1 }"))
    with pytest.raises(FedshiftError, match="algorithm.nu"):
        reproduce(str(path), db=tmp_path / "r.db", out_dir=tmp_path / "o")
    assert not (tmp_path / "r.db").exists() or RunStore(tmp_path / "r.db").runs() == []


def test_sweep_combines_runs_into_environments(tmp_path):
    text = TWO.replace(
        "[quick]\nrounds = 1\n", '[sweep]\nkey = "scenario.p_val"\nvalues = [0.1, 0.3]\n'
    )
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    out = reproduce(str(path), db=tmp_path / "r.db", out_dir=tmp_path / "o", seeds=1)
    m = out["methods"][0]
    assert len(m["run_ids"]) == 2  # one run per swept value
    store = RunStore(tmp_path / "r.db")
    averages = [store.run(r)["metrics"]["average"] for r in m["run_ids"]]
    assert m["ours"]["worst"] == pytest.approx(min(averages))
    assert m["ours"]["average"] == pytest.approx(sum(averages) / 2)


def test_cli_reproduce_quick_json(tmp_path):
    tiny = tmp_path / "two.toml"
    tiny.write_text(TWO)
    result = CliRunner().invoke(
        app,
        [
            "reproduce",
            str(tiny),
            "--quick",
            "--json",
            "--db",
            str(tmp_path / "c.db"),
            "--out",
            str(tmp_path / "cli"),
            "--set",
            "batch_size=7",
            "--export",
            str(tmp_path / "evidence"),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["table"] == "tiny" and len(summary["methods"]) == 2
    exported = {p.stem for p in (tmp_path / "evidence").glob("*.json")}
    assert exported == {m["run_ids"][0] for m in summary["methods"]}  # --export: every run
    assert all(len(m["run_ids"]) == 1 for m in summary["methods"])  # --quick: one seed
    store = RunStore(tmp_path / "c.db")
    for m in summary["methods"]:  # --set reaches every method's run
        assert store.run(m["run_ids"][0])["config"]["batch_size"] == 7
    report = (tmp_path / "cli" / "report.md").read_text()
    assert "`batch_size = 7`" in report
    wrong = CliRunner().invoke(app, ["reproduce", str(tiny), "--quick", "--set", "bach_size=7"])
    assert wrong.exit_code == 2 and "bach_size" in wrong.output


def test_reproduce_methods_runs_the_chosen_subset(tmp_path):
    tiny = tmp_path / "tiny.toml"
    tiny.write_text(TINY)
    out = reproduce(
        str(tiny),
        quick=True,
        db=tmp_path / "m.db",
        out_dir=tmp_path / "m",
        methods=["fedprox", "FTFA"],
    )
    assert [m["name"] for m in out["methods"]] == ["FedProx", "FTFA"]  # the table's order
    report = (tmp_path / "m" / "report.md").read_text()
    assert "not run" in report and "FedAvg, Local" in report
    # an algorithm option reaches only the methods whose algorithm has it
    mixed = reproduce(
        str(tiny),
        quick=True,
        db=tmp_path / "m.db",
        out_dir=tmp_path / "m2",
        methods=["fedavg", "fedprox"],
        extra={"algorithm.mu": "0.5"},
    )
    store = RunStore(tmp_path / "m.db")
    configs = [store.run(m["run_ids"][0])["config"] for m in mixed["methods"]]
    assert "algorithm.mu" not in configs[0] and float(configs[1]["algorithm.mu"]) == 0.5
    with pytest.raises(FedshiftError, match="no method of table .* 'nu'"):
        reproduce(str(tiny), quick=True, db=tmp_path / "m.db", extra={"algorithm.nu": "1"})
    with pytest.raises(FedshiftError, match="no method 'fedsgd'.*FedAvg"):
        reproduce(str(tiny), quick=True, db=tmp_path / "m.db", methods=["fedsgd"])
    bad = CliRunner().invoke(app, ["reproduce", "no-such-table"])
    assert bad.exit_code == 2 and "unknown table" in bad.output


def test_first_seed_runs_fresh_seeds(tmp_path):
    tiny = tmp_path / "two.toml"
    tiny.write_text(TWO)
    args = ["reproduce", str(tiny), "--quick", "--json", "--db", str(tmp_path / "f.db")]
    result = CliRunner().invoke(
        app, [*args, "--out", str(tmp_path / "f"), "--seeds", "2", "--first-seed", "3"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    store = RunStore(tmp_path / "f.db")
    for m in summary["methods"]:
        assert [store.run(r)["seed"] for r in m["run_ids"]] == [3, 4]
    assert "2 seed(s), 3–4" in (tmp_path / "f" / "report.md").read_text()
    bad = CliRunner().invoke(app, [*args, "--first-seed", "-1"])
    assert bad.exit_code == 2 and "--first-seed" in bad.output
    # a table whose settings were selected on seed 0 says so: its runs start past it
    past = tmp_path / "past.toml"
    past.write_text(TWO.replace("[table]\n", "[table]\nfirst_seed = 5\n", 1))
    args = ["reproduce", str(past), "--quick", "--json", "--db", str(tmp_path / "p.db")]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "p"), "--seeds", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    store = RunStore(tmp_path / "p.db")
    assert {store.run(m["run_ids"][0])["seed"] for m in summary["methods"]} == {5}
    assert "1 seed(s), 5–5" in (tmp_path / "p" / "report.md").read_text()


SPEC_ALGORITHMS = set(
    "fedavg fedprox scaffold local ftfa pfedme ditto apfl perfedavg l2sgd ifca fedrep fedrod "
    "fedpac fedbn cfl fedfomo drfa fedsr fediir irm groupdro irm-ft irm-l2 fedsdr fedsdr-fedavg "
    "fedsdr-pfedme fedpin perinvfl cgpfl cgpfl-heur ucfl fedipg dfl fedgen fedensemble".split()
)


def test_shipped_tables_parse_and_are_listed():
    names = table_names()
    for required in (
        "thesis-5.1-cmnist8",
        "thesis-5.1-cmnist80",
        "thesis-5.1-cfmnist8",
        "thesis-5.1-cfmnist80",
        "thesis-5.2-cmnist",
        "thesis-4.1-scm",
        "thesis-3.1-mnist-mlr",
        "thesis-3.1-cifar10-cnn",
        "perinvfl-rcmnist",
        "perinvfl-rcfmnist",
        "perinvfl-waterbirds",
        "ucfl-label-shift",
        "ucfl-label-covariate",
        "ucfl-concept-shift",
        "fedipg-rotmnist5",
        "fedipg-rotmnist50",
        "dfl-bgcolor-mnist",
        "thesis-5.1-waterbirds8",
        "thesis-5.1-pacs6",
        "fedipg-pacs5",
        "fedipg-pacs50",
        "fedipg-vlcs5",
        "fedipg-vlcs50",
    ):
        assert required in names
    for n in names:
        t = load_table(n)
        assert t.id == n and t.methods and t.source
        for m in t.methods:
            assert m.algorithm in SPEC_ALGORITHMS, (n, m.algorithm)
            assert m.published or m.ours, (n, m.name)
            assert all(0 <= v <= 100 for v in m.published.values())
            if m.ours:
                assert not m.published and "ours" in t.notes.lower(), (n, m.name)
    for rot in ("fedipg-rotmnist5", "fedipg-rotmnist50"):  # Table II: mean over LODO folds
        t = load_table(rot)
        assert t.sweep_key == "scenario.held_out"
        assert t.sweep_values == [0, 15, 30, 45, 60, 75]
    for dom in ("fedipg-pacs5", "fedipg-pacs50", "fedipg-vlcs5", "fedipg-vlcs50"):
        t = load_table(dom)  # Table II's PACS / VLCS columns: every domain held out once
        assert t.sweep_key == "scenario.held_out" and len(t.sweep_values) == 4
    t = load_table("thesis-5.1-cmnist8")
    fedpin = next(m for m in t.methods if m.name == "FedPIN")
    assert fedpin.published == {"worst": 53.6, "average": 55.4}
    abl = load_table("thesis-5.2-cmnist")
    assert [m.options["variant"] for m in abl.methods] == [
        "gm",
        "gm-ft",
        "gm-l2",
        "pm-lambda0",
        "pm-gamma0",
        "pm",
    ]
    listed = CliRunner().invoke(app, ["list", "presets", "--json"])
    items = {i["name"]: i for i in json.loads(listed.stdout)}
    assert (
        "thesis-5.1-cmnist8" in items
        and "fedshift reproduce" in items["thesis-5.1-cmnist8"]["help"]
    )
    assert "mnist-iid-fedavg" in items  # the run presets are still there


def test_top_level_configs_folder_is_the_packaged_one():
    from pathlib import Path

    top = Path(__file__).resolve().parents[1] / "configs"
    assert sorted(p.stem for p in top.glob("*.toml")) == table_names()
    for p in top.glob("*.toml"):
        tomllib.loads(p.read_text())


def test_resume_reuses_finished_runs_and_continues_a_stopped_one(tmp_path, monkeypatch):
    """A table that outlives a session: `--resume` reuses the store's finished runs of the
    same configuration and continues a stopped one from its checkpoint, with the numbers of
    an uninterrupted table."""
    path = tmp_path / "two.toml"
    path.write_text(TWO.replace("rounds = 2", "rounds = 4\ncheckpoint_every = 1"))
    reference = reproduce(str(path), db=tmp_path / "ref.db", out_dir=tmp_path / "ref")
    db = tmp_path / "runs.db"
    # the seventh round trained: FedAvg, seed 1, its third round
    with power_cut_at(monkeypatch, call=7), pytest.raises(RuntimeError):
        reproduce(str(path), db=db, out_dir=tmp_path / "a")
    before = {r["run_id"]: r["status"] for r in RunStore(db).runs()}
    assert sorted(before.values()) == ["done", "failed"]
    out = reproduce(str(path), db=db, out_dir=tmp_path / "b", resume=True)
    runs = RunStore(db).runs()
    assert len(runs) == 4 and all(r["status"] == "done" for r in runs)
    first = out["methods"][0]["run_ids"]
    assert set(before) <= {rid for m in out["methods"] for rid in m["run_ids"]}
    assert first[0] in before and before[first[0]] == "done"  # reused, not re-run
    for ours, ref in zip(out["methods"], reference["methods"], strict=True):
        assert ours["ours"] == pytest.approx(ref["ours"])
    # resuming again trains nothing more
    again = reproduce(str(path), db=db, out_dir=tmp_path / "c", resume=True)
    assert len(RunStore(db).runs()) == 4
    assert [m["run_ids"] for m in again["methods"]] == [m["run_ids"] for m in out["methods"]]


def test_tuned_settings_are_recorded_checked_and_reported(tmp_path):
    text = TWO.replace(
        "options = { mu = 0.1 }",
        'options = { mu = 0.1 }\ntuned = { "algorithm.mu" = "sweep over 0.01,0.1 on val: 0.1" }',
    ).replace('source = "a test table"', 'source = "a test table"\ntuned = { lr = "val sweep" }')
    path = tmp_path / "tuned.toml"
    path.write_text(text)
    table = load_table(str(path))
    assert table.tuned == {"lr": "val sweep"}
    assert table.methods[1].tuned == {"algorithm.mu": "sweep over 0.01,0.1 on val: 0.1"}
    reproduce(str(path), db=tmp_path / "r.db", out_dir=tmp_path / "out", seeds=1, quick=True)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Settings the paper does not give" in report
    assert "| FedProx | algorithm.mu | sweep over 0.01,0.1 on val: 0.1 |" in report
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('"algorithm.mu" = ', '"algorithm.alpha" = '))
    with pytest.raises(FedshiftError, match="does not set it"):
        load_table(str(bad))


def test_untuned_and_given_settings_are_reported_and_unrecorded_ones_named(tmp_path):
    """A report cannot leave out how a setting was chosen: by validation (tuned), by hand
    (untuned) or by the paper (given); a hyper-parameter with no record is named."""
    from fedshift.tables import unrecorded_settings

    text = TWO.replace(
        'source = "a test table"',
        'source = "a test table"\n'
        'untuned = { rounds = "ours: the paper gives none", batch_size = "ours" }\n'
        'given = { lr = "§4, Table 2" }',
    )
    path = tmp_path / "records.toml"
    path.write_text(text)
    table = load_table(str(path))
    assert table.untuned == {"rounds": "ours: the paper gives none", "batch_size": "ours"}
    assert unrecorded_settings(table) == [
        ("all methods", "local_steps"),
        ("FedProx", "algorithm.mu"),
    ]
    out = reproduce(str(path), db=tmp_path / "r.db", out_dir=tmp_path / "out", seeds=1, quick=True)
    assert out["settings"]["given"] == {"lr": "§4, Table 2"}
    assert out["settings"]["unrecorded"] == [
        ["all methods", "local_steps"],
        ["FedProx", "algorithm.mu"],
    ]
    assert out["methods"][1]["settings"]["tuned"] == {}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "set by hand (no validation chose them)" in report
    assert "| all methods | rounds | ours: the paper gives none |" in report
    assert (
        "### Settings from the paper" in report and "| all methods | lr | §4, Table 2 |" in report
    )
    assert "`local_steps` (all methods), `algorithm.mu` (FedProx)" in report
    # a module default may be declared, an option the algorithm lacks may not
    ok = text.replace(
        "options = { mu = 0.1 }", 'options = { mu = 0.1 }\ngiven = { "algorithm.mu" = "§5" }'
    )
    assert unrecorded_settings(load_table(_write(tmp_path / "ok.toml", ok))) == [
        ("all methods", "local_steps")
    ]
    stray = text.replace(
        'name = "FedAvg"', 'name = "FedAvg"\nuntuned = { "algorithm.alpha" = "ours" }'
    )
    with pytest.raises(FedshiftError, match="neither sets it nor has it as an option of fedavg"):
        load_table(_write(tmp_path / "stray.toml", stray))
    twice = text.replace('given = { lr = "§4, Table 2" }', 'given = { rounds = "§4" }')
    with pytest.raises(FedshiftError, match="recorded as both untuned and given"):
        load_table(_write(tmp_path / "twice.toml", twice))


def _write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("table_id", table_names())
def test_every_shipped_table_says_how_each_setting_was_chosen(table_id):
    from fedshift.tables import unrecorded_settings

    assert unrecorded_settings(load_table(table_id)) == []
