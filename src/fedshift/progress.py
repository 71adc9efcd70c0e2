"""The training progress bar of ``fedshift run`` and ``fs.run``: one line (label, bar, round,
loss, accuracy, ETA) laid out by hand to the console's width. Rich's own table layout
shrank every column at 80 columns — the width it assumes off a terminal — and cut the ETA
to "0:0…"; here the figures stay whole and the label, then the bar, give way.

Off a terminal (a log file of an unattended paper-scale run, ``nohup … > log``) a live bar
draws nothing until the run ends, hours later; there the same line is printed as plain
text after the first round, then at most once every ``LOG_EVERY_S`` seconds, and when the
run ends."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task
from rich.text import Text

MAX_BAR = 30
MIN_BAR = 6
MIN_LABEL = 12
LOG_EVERY_S = 60.0  # off a terminal: seconds between two progress lines


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--"
    minutes, s = divmod(int(seconds), 60)
    h, m = divmod(minutes, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def figures(task: Task, word: bool = True) -> str:
    """What the run has done: ``round 12/20 loss 0.1234 acc 95.3% ETA 0:05``."""
    done = f"{'round ' if word else ''}{int(task.completed)}/{int(task.total or 0)}"
    if task.finished:
        when = f"took {clock(task.finished_time)}"
    else:
        when = f"ETA {clock(task.time_remaining)}"
    return f"{done} loss {task.fields['loss']} acc {task.fields['acc']} {when}"


class RunLine(ProgressColumn):
    """The whole line as one column, its parts fitted to ``console.width``: the figures
    whole; the label as long as fits beside a bar of at least ``MIN_BAR``; the word
    "round" dropped before the label is cut."""

    def __init__(self, label: str, console: Console) -> None:
        super().__init__()
        self.label, self.console = label, console

    def render(self, task: Task) -> Text:
        width = self.console.width
        stats = figures(task)
        if width - len(stats) - MIN_BAR - 2 < len(self.label):
            stats = figures(task, word=False)
        room = width - len(stats) - 1  # label, bar and the spaces between them
        bar = min(MAX_BAR, max(MIN_BAR, room - len(self.label) - 1))
        if room - bar - 1 < MIN_LABEL:  # very narrow: no bar, then a shorter label
            bar = 0
        label_width = max(0, room - bar - (1 if bar else 0))
        line = Text(no_wrap=True, overflow="crop")
        if label_width:
            label = Text(self.label, style="bold")
            label.truncate(label_width, overflow="ellipsis", pad=True)
            line.append_text(label).append(" ")
        if bar:
            filled = round(bar * task.completed / task.total) if task.total else 0
            style = "bar.finished" if task.finished else "bar.complete"
            line.append("━" * filled, style=style).append("━" * (bar - filled), style="bar.back")
            line.append(" ")
        return line.append(stats)


def progress_bar(total: int, label: str, console: Console | None = None):
    """A bar for one run of ``total`` rounds and the ``on_round`` callback that advances
    it; it starts at the first round (after validation, which may still refuse the run).
    Call ``.stop()`` on the bar when the run ends."""
    console = console or Console(stderr=True, emoji=False)
    live = console.is_terminal or console.is_jupyter
    progress = Progress(RunLine(label, console), console=console, transient=False)
    if not live:
        progress = LogLines(progress, console)
    task = progress.add_task(label, total=total, loss="—", acc="—")

    def on_round(rec) -> None:
        if live and not progress.live.is_started:
            progress.start()
        fields = {"loss": f"{rec.loss:.4g}"}
        if rec.metrics:
            fields["acc"] = f"{rec.metrics['average']:.1f}%"
        progress.update(task, completed=rec.round, **fields)

    return progress, on_round


class LogLines:
    """A ``Progress`` off a terminal: its line printed after the first round, then at most
    every ``LOG_EVERY_S`` seconds, and at ``stop()`` (the final line, with the time taken)."""

    def __init__(self, progress: Progress, console: Console) -> None:
        self.progress, self.console = progress, console
        self.printed_at: float | None = None
        self.stopped = False

    def add_task(self, *args, **kwargs):
        return self.progress.add_task(*args, **kwargs)

    def update(self, task, **fields) -> None:
        self.progress.update(task, **fields)
        now = self.progress.get_time()
        if self.printed_at is None or now - self.printed_at >= LOG_EVERY_S:
            self._print()
            self.printed_at = now

    def get_renderable(self):
        return self.progress.get_renderable()

    def stop(self) -> None:
        if self.stopped or self.printed_at is None:  # nothing ran: nothing to report
            return
        self.stopped = True  # a finished task reads "took …" (rich marks it at its last update)
        self._print()

    def _print(self) -> None:
        self.console.print(self.progress.get_renderable(), soft_wrap=False)


def wanted(progress: bool | None) -> bool:
    """``fs.run(progress=None)`` shows a bar where someone watches: stderr is a terminal,
    or a Jupyter notebook (logs and CI stay clean); True and False force it."""
    if progress is not None:
        return progress
    console = Console(stderr=True)
    return console.is_terminal or console.is_jupyter
