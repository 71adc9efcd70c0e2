"""TensorBoard: one log folder per run (``tensorboard --logdir runs/tensorboard``) with the
config as text and in the HParams tab, a scalar per round figure, and the final table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .sink import SUMMARY_KEYS, Sink, final_scalars, final_table


def last_step(folder: Path) -> int:
    """The last round the folder's event files hold (0 for a new folder)."""
    if not folder.is_dir() or not any(folder.glob("events.out.tfevents.*")):
        return 0
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    if "loss" not in acc.Tags()["scalars"]:
        return 0
    return max(e.step for e in acc.Scalars("loss"))


def config_text(config: dict[str, Any]) -> str:
    lines = ["| key | value |", "|---|---|"]
    return "\n".join(lines + [f"| {k} | {v} |" for k, v in config.items()])


class TensorBoardSink(Sink):
    name = "TensorBoard"

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        fresh = not folder.is_dir()
        self.last = last_step(folder)
        self.writer = SummaryWriter(str(folder))
        if fresh:  # HParams: the config beside the final figures, comparable across runs
            from torch.utils.tensorboard.summary import hparams

            values = {
                k: v if isinstance(v, (int, float, str, bool)) else str(v)
                for k, v in config.items()
            }
            for summary in hparams(values, {f"final/{k}": 0.0 for k in SUMMARY_KEYS}):
                self.writer.file_writer.add_summary(summary)
        # the config at each start: a resume may have changed some keys (see overrides)
        self.writer.add_text("config", config_text(config), self.last)
        self.writer.flush()

    def write_round(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a killed run keeps what it logged

    def finish(self, metrics: dict[str, Any]) -> None:
        for tag, value in final_scalars(metrics).items():
            self.writer.add_scalar(tag, value, self.last)
        self.writer.add_text("final accuracy", final_table(metrics), self.last)
        self.writer.close()

    def close(self, status: str) -> None:
        self.writer.add_text("status", f"{status} after round {self.last}", self.last)
        self.writer.close()
