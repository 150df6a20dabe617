"""Summary statistics, scores and peak memory: what the loop and the evaluations measure.

Every timing in result.json goes through :func:`summarize` so the tables of the studies
(mean, std, min, max, and the median that makes comparisons robust) come out in one shape.
The progress bar and ``metrics.jsonl`` are in :mod:`gnnpar.training.progress`, the loss in
:mod:`gnnpar.training.losses`, result.json in :mod:`gnnpar.result`.
"""

from __future__ import annotations

import resource
import statistics
from collections.abc import Iterable

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
    """Accuracy for single-label data; micro-F1 (logit > 0 is a positive) for multi-label data.

    Both from whole counts, so that a score is the same number on every device (a float32 mean
    on CUDA rounded 405 / 500 one unit away from the CPU's, and ``gnnpar predict`` differed)."""
    if logits.numel() == 0:
        return 0.0
    if not multilabel:
        return int((logits.argmax(dim=-1) == y).sum()) / y.numel()
    pred = logits > 0
    truth = y > 0.5
    tp = (pred & truth).sum().item()
    fp = (pred & ~truth).sum().item()
    fn = (~pred & truth).sum().item()
    denom = 2 * tp + fp + fn
    return 2 * tp / denom if denom else 1.0


# ---------------------------------------------------------------------------------- memory
def peak_memory(device) -> dict[str, int]:
    """This process's peak resident memory (and the accelerator's peak allocation) in bytes."""
    peak = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device is not None and device.type == "cuda":
        peak["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return peak
