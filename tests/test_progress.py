"""The progress line fits the console (80 columns off a terminal) with its figures whole, and
``fs.run`` shows it where someone watches."""

from __future__ import annotations

import pytest
from rich.console import Console
from toy import toy_data

import fedshift as fs
from fedshift.engine.runner import RoundRecord
from fedshift.progress import progress_bar, wanted

LABEL = "fedsdr-pfedme on rotmnist-lodo (seed 12) with a long label"


def rendered(width: int, label: str, total: int, done: int) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    bar, on_round = progress_bar(total, label, console)
    for r in range(1, done + 1):
        metrics = {"average": 95.25} if r % 2 == 0 else None
        on_round(
            RoundRecord(
                round=r, loss=0.123456, bytes_up=1, bytes_down=1, time_s=0.1, metrics=metrics
            )
        )
    console.export_text()  # off a terminal the first round's line was printed: drop it
    console.print(bar.get_renderable())  # the line as it stands mid-run
    bar.stop()
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 60])
@pytest.mark.parametrize("total", [20, 1_000_000])
def test_the_line_fits_the_width_with_every_figure_whole(width, total):
    mid, *_ = rendered(width, LABEL, total, 4)
    assert len(mid) <= width
    figures = f"4/{total} loss 0.1235 acc 95.2% ETA "
    assert figures in mid, mid
    assert mid.split("ETA ")[1].strip().count(":") >= 1  # a whole clock, not "0:0…"
    assert "…" in mid  # the label gave way, the figures did not


def test_a_short_label_keeps_the_word_round_and_a_bar():
    *_, end = rendered(80, "fedavg on toy", 20, 20)
    assert end.startswith("fedavg on toy ━") and "round 20/20 loss 0.1235" in end
    assert " took " in end and len(end) <= 80


def test_fs_run_shows_a_bar_where_asked_and_not_in_logs(capsys):
    settings = dict(lr=0.1, batch_size=8, rounds=3, model_options={"hidden": [8]})
    fs.run(algorithm="fedavg", data=toy_data(), progress=True, **settings)
    err = capsys.readouterr().err
    assert "fedavg on toy" in err and "round 3/3" in err and "took" in err
    assert not wanted(None)  # stderr is no terminal here: no bar by default
    fs.run(algorithm="fedavg", data=toy_data(), **settings)
    fs.run(algorithm="fedavg", data=toy_data(), progress=False, **settings)
    assert capsys.readouterr().err == ""


def test_off_a_terminal_the_line_is_logged_now_and_then_not_only_at_the_end(monkeypatch):
    """An unattended run's log (``nohup … > log``) shows progress during the run: the line
    after the first round, then at most every LOG_EVERY_S seconds, and the final one."""
    from fedshift import progress

    def logged(every: float, rounds: int) -> list[str]:
        monkeypatch.setattr(progress, "LOG_EVERY_S", every)
        console = Console(width=100, record=True, force_terminal=False, color_system=None)
        bar, on_round = progress_bar(rounds, "fedavg on toy", console)
        for r in range(1, rounds + 1):
            on_round(RoundRecord(round=r, loss=0.5, bytes_up=1, bytes_down=1, time_s=0.1))
        bar.stop()
        bar.stop()  # a second stop prints nothing more
        return console.export_text().splitlines()

    first, end = logged(3600.0, 5)
    assert "round 1/5" in first and "ETA" in first
    assert "round 5/5" in end and "took" in end
    lines = logged(0.0, 5)
    assert [f"round {r}/5" in line for r, line in enumerate(lines[:5], 1)] == [True] * 5
    assert len(lines) == 6 and "took" in lines[-1]
    console = Console(width=100, record=True, force_terminal=False, color_system=None)
    bar, _ = progress_bar(5, "never started", console)
    bar.stop()  # refused before its first round: no line at all
    assert console.export_text() == ""
