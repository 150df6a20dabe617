"""Timers, summary statistics, scores, progress display and result.json.

Every timing in result.json goes through :func:`summarize` so the tables of the studies
(mean, std, min, max, and the median that makes comparisons robust) come out in one shape.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch


def summarize(times: Iterable[float]) -> dict[str, float]:
    """{mean, std, min, max, median, count} of a list of seconds; zeros for an empty list."""
    xs = [float(t) for t in times]
    if not xs:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "median": 0.0, "count": 0}
    return {
        "mean": statistics.fmean(xs),
        "std": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "max": max(xs),
        "median": statistics.median(xs),
        "count": len(xs),
    }


# ---------------------------------------------------------------------------------------- scores
def score_name(multilabel: bool) -> str:
    return "micro_f1" if multilabel else "accuracy"


@torch.no_grad()
def score(logits: torch.Tensor, y: torch.Tensor, multilabel: bool) -> float:
    """Accuracy for single-label data; micro-F1 (logit > 0 is a positive) for multi-label data."""
    if logits.numel() == 0:
        return 0.0
    if not multilabel:
        return float((logits.argmax(dim=-1) == y).float().mean())
    pred = logits > 0
    truth = y > 0.5
    tp = (pred & truth).sum().item()
    fp = (pred & ~truth).sum().item()
    fn = (~pred & truth).sum().item()
    denom = 2 * tp + fp + fn
    return 2 * tp / denom if denom else 1.0


def loss_fn(logits: torch.Tensor, y: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """Cross-entropy for single-label data, BCE-with-logits for multi-label (study 003).

    Always on fp32 logits (``--precision bf16`` computes them in bfloat16)."""
    logits = logits.float()  # a no-op (the same tensor) in fp32
    if multilabel:
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float())
    return torch.nn.functional.cross_entropy(logits, y)


# -------------------------------------------------------------------------------------- progress
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


def peak_memory(device) -> dict[str, int]:
    """This process's peak resident memory (and the accelerator's peak allocation) in bytes."""
    peak = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device is not None and device.type == "cuda":
        peak["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return peak


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


# ----------------------------------------------------------------------------------- result.json
def versions() -> dict[str, str]:
    import torch_geometric

    import gnnpar

    return {
        "torch": str(torch.__version__),
        "torch_geometric": torch_geometric.__version__,
        "gnnpar": gnnpar.__version__,
        "python": platform.python_version(),
    }


def machine() -> dict[str, Any]:
    accel = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu_count": os.cpu_count(),
        "accelerator": accel,
        "platform": platform.platform(),
        "hostname": platform.node(),
    }


REQUIRED_KEYS = (
    "dataset",
    "model",
    "strategy",
    "workers",
    "epochs",
    "seed",
    "config",
    "train_time_s",
    "partition_time_s",
    "step_time_s",
    "test_step_time_s",
    "score_name",
    "test_score",
    "val_score",
    "per_worker_batches",
    "loss_curve",
    "versions",
    "machine",
)


def write_result(result: dict[str, Any], out_dir: str | os.PathLike) -> Path:
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:  # a programming error, not user input
        raise RuntimeError(f"result.json is missing required keys: {missing}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "result.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=False, default=_jsonable))
    tmp.replace(path)
    return path


def _jsonable(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")
