"""`fedshift report` / `fedshift compare`: Markdown or HTML reports with plots, built from
the run store only, so they work for any past run."""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from ..errors import FedshiftError  # noqa: E402
from . import html_page as page_html  # noqa: E402
from .logged import OPTIONAL_FIGURES, event_rows  # noqa: E402
from .partial import partial_note, partial_sentence, with_last_evaluation  # noqa: E402
from .plots import (  # noqa: E402
    DEGENERATE,
    accuracy_curves_figure,
    clients_figure,
    loss_figure,
    per_env_figure,
    save,
    series_of,
)
from .provenance import config_rows, environment_rows  # noqa: E402
from .store import RunStore  # noqa: E402


def run_label(run: dict) -> str:
    cfg = run["config"]
    label = f"{run['algorithm']} ({run['run_id']})"
    label += ", oracle data" if cfg.get("scenario.oracle") else ""
    note = partial_note(run)
    label += f" ({note})" if note else ""
    return label + (DEGENERATE if (run.get("metrics") or {}).get("degenerate") else "")


def degenerate_note(runs: list[dict]) -> str | None:
    """One sentence naming the runs whose model is degenerate, and why; None if none is."""
    bad = [r for r in runs if (r.get("metrics") or {}).get("degenerate")]
    if not bad:
        return None
    why = "; ".join(f"{r['run_id']}: {r['metrics'].get('degenerate_why')}" for r in bad)
    return (
        "† degenerate: the model answers one class everywhere, never left chance-level "
        "training loss, or scores under the majority class on its own training data, so its "
        f"accuracies are no result ({why})."
    )


def load_runs(store: RunStore, run_ids: list[str]) -> list[dict]:
    """The runs as reports read them: an unfinished one with its last evaluation, marked
    (:mod:`fedshift.results.partial`)."""
    return [with_last_evaluation(store.run(r)) for r in run_ids]


def env_names(runs: list[dict]) -> list[str]:
    """Every run's test environments, in the order first seen (runs of different
    scenarios have different ones: each gets its row, "—" where a run has none)."""
    return list(dict.fromkeys(e for r in runs for e in r["metrics"]["per_env"] or {}))


def plot_per_env(runs: list[dict], path: Path) -> Path:
    """Accuracy against the test environments (results/plots.py says how it is drawn)."""
    return save(per_env_figure(series_of(runs, run_label)), path)


def plot_over_training(runs: list[dict], path: Path, by: str) -> Path:
    """Average and worst accuracy against rounds or communicated MB."""
    return save(accuracy_curves_figure(series_of(runs, run_label), by), path)


def plot_loss(runs: list[dict], path: Path) -> Path:
    """Training loss against rounds."""
    return save(loss_figure(series_of(runs, run_label)), path)


def plot_per_client(runs: list[dict], path: Path) -> Path:
    """Per-client accuracy: bars for a few clients, distributions for many."""
    return save(clients_figure(runs, [run_label(r) for r in runs]), path)


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.1f}"


def tables(runs: list[dict]) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    head = ["run", "scenario", "seed", "rounds", "worst", "average", "worst client", "time s", "MB"]
    rows = [
        [
            run_label(r),
            r["scenario"],
            str(r["seed"]),
            f"{r['rounds_done']}/{r['rounds']}",
            _fmt(r["metrics"]["worst"]),
            _fmt(r["metrics"]["average"]),
            _fmt(r["metrics"]["worst_client"]),
            f"{r['time_s'] or 0:.1f}",
            f"{(r['bytes_up'] + r['bytes_down']) / 1e6:.1f}",
        ]
        for r in runs
    ]
    envs = env_names(runs)
    env_head = ["test environment"] + [run_label(r) for r in runs]
    env_rows = [[e] + [_fmt(r["metrics"]["per_env"].get(e)) for r in runs] for e in envs]
    return head, rows, env_head, env_rows


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


FIGURES = [
    ("accuracy_per_env.png", "Accuracy per test environment", plot_per_env),
    (
        "accuracy_per_round.png",
        "Accuracy over rounds",
        lambda r, p: plot_over_training(r, p, "round"),
    ),
    ("loss_per_round.png", "Training loss over rounds", plot_loss),
    (
        "accuracy_per_mb.png",
        "Accuracy against communication",
        lambda r, p: plot_over_training(r, p, "bytes"),
    ),
    ("accuracy_per_client.png", "Accuracy per client", plot_per_client),
]
# what `fedshift compare` draws: the per-environment plot first (its JSON "plot")
COMPARE_FIGURES = [(name, fn) for name, _, fn in FIGURES if name != "accuracy_per_mb.png"]


MARKER = ".fedshift-report"  # in a report folder: the files fedshift wrote there, one a line


def claim_folder(out: Path, names: list[str], force: bool) -> None:
    """Make ``out`` ready for files ``names``: refuse, before anything is written, to
    overwrite a file there that fedshift did not write (not listed in the folder's
    marker) unless ``force``."""
    if out.exists() and not out.is_dir():
        raise FedshiftError(f"--out {str(out)!r} is a file; give a folder")
    foreign = [n for n in names if (out / n).exists() and n not in written_by_us(out)]
    if foreign and not force:
        raise FedshiftError(
            f"{str(out)!r} already holds {', '.join(foreign)}, which fedshift did not write "
            "there; give another --out folder, or --force to overwrite them"
        )
    out.mkdir(parents=True, exist_ok=True)


def written_by_us(out: Path) -> set[str]:
    marker = out / MARKER
    return set(marker.read_text().split()) if marker.is_file() else set()


def mark_written(out: Path, names: list[str]) -> None:
    """List ``names`` in the folder's marker (files fedshift wrote there)."""
    names = sorted(written_by_us(out) | set(names))
    (out / MARKER).write_text("".join(f"{n}\n" for n in names))


def write_report(
    store: RunStore,
    run_ids: list[str],
    out_dir: str | Path,
    fmt: str = "md",
    *,
    force: bool = True,
) -> Path:
    """Write ``report.<fmt>`` and its figures into ``out_dir``; with ``force=False`` (the
    CLI's default) files there that fedshift did not write are never overwritten."""
    if fmt not in ("md", "html"):
        raise FedshiftError(f"report format {fmt!r} is not supported; use md or html")
    runs = load_runs(store, run_ids)
    out = Path(out_dir)
    names = [n for n, _, _ in FIGURES] + [n for n, _, _ in OPTIONAL_FIGURES] + [f"report.{fmt}"]
    claim_folder(out, names, force)
    figures = [(title, fn(runs, out / name).name) for name, title, fn in FIGURES]
    for name, title, fn in OPTIONAL_FIGURES:
        drawn = fn(runs, out / name)
        if drawn is not None:
            figures.append((title, drawn.name))
    head, rows, env_head, env_rows = tables(runs)
    faults = event_rows(runs)
    fault_head = ["run", "client fault", "uploads affected"]
    title = f"fedshift report: {', '.join(r['run_id'] for r in runs)}"
    intro = "Accuracies in %; worst/average over test environments of the client-averaged accuracy."
    notes = [n for n in (partial_sentence(runs), degenerate_note(runs)) if n]
    config, environment = config_rows(runs), environment_rows(runs)
    if fmt == "md":
        parts = [f"# {title}", intro, *notes, _md_table(head, rows), _md_table(env_head, env_rows)]
        if faults:
            parts += ["## Client faults", _md_table(fault_head, faults)]
        parts += [f"## {t}\n\n![{t}]({f})" for t, f in figures]
        parts += ["## Config", _md_table(*config), "## Environment", _md_table(*environment)]
        path = out / "report.md"
        path.write_text("\n\n".join(parts) + "\n")
    else:
        sections = [(None, f"<p>{html.escape(intro)}</p>")]
        sections += [(None, page_html.note(n)) for n in notes]
        sections += [
            (None, page_html.table(head, rows)),
            (None, page_html.table(env_head, env_rows)),
        ]
        if faults:
            sections.append(("Client faults", page_html.table(fault_head, faults)))
        sections += [(t, page_html.figure(t, out / f)) for t, f in figures]
        sections.append(("Config", page_html.table(*config)))
        sections.append(("Environment", page_html.table(*environment)))
        path = out / "report.html"
        path.write_text(page_html.page(title, sections))
    mark_written(out, [path.name] + [f for _, f in figures])
    return path
