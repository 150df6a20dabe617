"""What a run shows and logs as it goes: the progress bar and ``<out>/metrics.jsonl``.

Only the rank that reports (:attr:`gnnpar.training.loop.Plan.reporter`) shows and writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

from gnnpar.training.metrics import peak_memory


class Progress:
    """A rich progress bar on rank 0 unless quiet; a no-op otherwise."""

    def __init__(self, total: int, description: str, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar = None
        if enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                transient=False,
            )
            self._task = self._bar.add_task(description, total=total, info="")
            self._bar.start()

    def log(self, line: str) -> None:
        """A line above the bar (kept in the terminal's scroll-back, unlike the bar's info)."""
        if self._bar is not None:
            self._bar.console.print(line, highlight=False)

    def update(self, advance: int = 1, info: str = "") -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, info=info)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MetricsLog:
    """``<out>/metrics.jsonl``, written as training goes (one JSON record per line, flushed), so
    a killed run keeps its curve: ``{"event": "step", "epoch", "step", "loss", "time_s"}`` per
    step, ``{"event": "epoch", "epoch", "loss", "val"?, "train_s"}`` per epoch, and
    ``{"event": "final", ...scores}`` at the end. Only the rank that reports writes it."""

    def __init__(self, out: str | None, tensorboard: bool = False, append: object = None) -> None:
        self.path = None if out is None else Path(out) / "metrics.jsonl"
        self.file = None
        self.resumed = append  # a resumed run appends to the curve it continues
        self.tb_dir = None if out is None or not tensorboard else Path(out) / "tensorboard"
        self.tb = None

    def __enter__(self) -> MetricsLog:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # line-buffered: one write per record
            self.file = open(self.path, "a" if self.resumed else "w", buffering=1)
            if self.resumed:
                self.write({"event": "resume", "from": str(self.resumed.path)})
        if self.tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # checked at start: train.prepare

            self.tb = SummaryWriter(str(self.tb_dir))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()

    def write(self, record: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")

    def step(self, epoch: int, step: int, loss: float | None, seconds: float) -> None:
        self.write({"event": "step", "epoch": epoch, "step": step, "loss": loss, "time_s": seconds})
        if self.tb is not None and loss is not None:
            self.tb.add_scalar("loss/step", loss, step)
            self.tb.add_scalar("time/step_s", seconds, step)

    def epoch(self, epoch: int, log, scores: dict | None, device) -> dict:
        """The epoch's record (also what the per-epoch line shows)."""
        count = log.loss_count[epoch]
        record = {"event": "epoch", "epoch": epoch, "train_s": log.train_s}
        record["loss"] = log.loss_sum[epoch] / count if count else None
        if scores is not None:
            record["val"] = scores.get("val")
        record.update(peak_memory(device))
        self.write(record)
        if self.tb is not None:
            for key in ("loss", "val"):
                if record.get(key) is not None:
                    self.tb.add_scalar(f"{key}/epoch", record[key], epoch + 1)
        return record

    def final(self, scores: dict, train_s: float) -> None:
        self.write({"event": "final", **scores, "train_s": train_s})
        if self.tb is not None:
            for key in ("val", "test"):
                if isinstance(scores.get(key), float):
                    self.tb.add_scalar(f"final/{key}", scores[key], 0)


def epoch_line(record: dict, epochs: int) -> str:
    """``epoch 3/20  loss 0.4123  val 0.812  12.3 s  peak 1.2 GiB``"""
    parts = [f"epoch {record['epoch'] + 1}/{epochs}"]
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4f}")
    if record.get("val") is not None:
        parts.append(f"val {record['val']:.3f}")
    parts.append(f"{record['train_s']:.1f} s")
    parts.append(f"peak {record['peak_rss_bytes'] / 2**30:.2f} GiB")
    if "cuda_peak_bytes" in record:
        parts.append(f"cuda {record['cuda_peak_bytes'] / 2**30:.2f} GiB")
    return "  ".join(parts)
