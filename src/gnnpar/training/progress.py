"""What a run shows and logs as it goes: the progress bar and ``<out>/metrics.jsonl``.

Only the rank that reports (:attr:`gnnpar.training.loop.Plan.reporter`) shows and writes them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gnnpar.errors import UsageError
from gnnpar.runtime import resources
from gnnpar.training.metrics import peak_memory


class Progress:
    """What rank 0 shows while it trains, unless quiet (a no-op otherwise).

    On a terminal, a rich progress bar; its text is the current epoch and the mean loss of the
    epoch's steps so far, the number the epoch's line then shows. Without one (stdout piped to
    a file or a CI log, where a bar is drawn once, cut at 80 columns), plain lines instead: one
    at most every ``every_s`` seconds while steps go on (``allreduce gcn x2: step 600/1200
    (50%), 0:00:12 elapsed, ~0:00:12 left; epoch 25 loss 0.5161``) and one when it ends, so a
    log says how far a long epoch got. ``log`` prints a line (the epoch lines) either way."""

    def __init__(
        self,
        total: int,
        description: str,
        enabled: bool = True,
        terminal: bool | None = None,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.total, self.description, self.every_s = total, description, every_s
        self.done, self.info = 0, ""
        self._bar = None
        self._plain = False
        self._clock = clock
        self._t0 = self._shown_at = clock()
        if not enabled:
            return
        if terminal is None:
            terminal = sys.stdout.isatty()
        if not terminal:
            self._plain = True
            return
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
        elif self._plain:
            print(line, flush=True)

    def update(self, advance: int = 1, info: str = "") -> None:
        self.done += advance
        if info:
            self.info = info
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, info=info)
        elif self._plain and advance and self._clock() - self._shown_at >= self.every_s:
            print(self.status_line(), flush=True)
            self._shown_at = self._clock()

    def status_line(self, end: bool = False) -> str:
        """``<description>: step 600/1200 (50%), 0:00:12 elapsed, ~0:00:12 left; <info>``, or
        at the end ``<description>: 1200/1200 steps in 0:00:24``."""
        elapsed = self._clock() - self._t0
        if end:
            return f"{self.description}: {self.done}/{self.total} steps in {_clock(elapsed)}"
        share = 100 * self.done // max(self.total, 1)
        line = f"{self.description}: step {self.done}/{self.total} ({share}%), "
        line += f"{_clock(elapsed)} elapsed"
        if 0 < self.done < self.total:
            line += f", ~{_clock(elapsed * (self.total - self.done) / self.done)} left"
        return f"{line}; {self.info}" if self.info else line

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self._plain:
            print(self.status_line(end=True), flush=True)
            self._plain = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _clock(seconds: float) -> str:
    """``0:01:05``, as the bar writes times."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class MetricsLog:
    """``<out>/metrics.jsonl``, written as training goes (one JSON record per line, flushed), so
    a killed run keeps its curve: ``{"event": "step", "epoch", "step", "loss", "time_s"}`` per
    step, ``{"event": "epoch", "epoch", "loss", "val"?, "train_s", ...the source's
    ``epoch_info``}`` per epoch (sampled from a prepared folder: ``feature_cache``), and
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
            try:
                with resources.writing(self.path):  # the last buffered line, on a full disk
                    self.file.close()
            except UsageError:
                if exc[0] is None:  # else the error already on its way explains the run
                    raise
        if self.tb is not None:
            self.tb.close()

    def write(self, record: dict) -> None:
        if self.file is not None:
            line = json.dumps(record) + "\n"
            with resources.writing(self.path, len(line)):  # a full disk: one message, exit 2
                self.file.write(line)

    def step(self, epoch: int, step: int, loss: float | None, seconds: float) -> None:
        self.write({"event": "step", "epoch": epoch, "step": step, "loss": loss, "time_s": seconds})
        if self.tb is not None and loss is not None:
            self.tb.add_scalar("loss/step", loss, step)
            self.tb.add_scalar("time/step_s", seconds, step)

    def epoch(self, epoch: int, log, scores: dict | None, device, info: dict | None = None) -> dict:
        """The epoch's record (also what the per-epoch line shows); ``info``: the source's
        own values for it (``Source.epoch_info``)."""
        count = log.loss_count[epoch]
        record = {"event": "epoch", "epoch": epoch, "train_s": log.train_s}
        record["loss"] = log.loss_sum[epoch] / count if count else None
        if scores is not None:
            record["val"] = scores.get("val")
        record.update(peak_memory(device))
        record.update(info or {})
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
    """``epoch 3/20  loss 0.4123  val 0.812  12.3 s  peak 1.2 GiB``; the last epoch's line also
    has ``test 0.790`` (the loop adds the final model's val and test to its record)."""
    parts = [f"epoch {record['epoch'] + 1}/{epochs}"]
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4f}")
    for key in ("val", "test"):
        if record.get(key) is not None:
            parts.append(f"{key} {float(record[key]):.3f}")
    parts.append(f"{record['train_s']:.1f} s")
    parts.append(f"peak {record['peak_rss_bytes'] / 2**30:.2f} GiB")
    if "cuda_peak_bytes" in record:
        parts.append(f"cuda {record['cuda_peak_bytes'] / 2**30:.2f} GiB")
    return "  ".join(parts)
