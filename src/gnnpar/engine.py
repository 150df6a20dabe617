"""The pieces of a training step shared by every strategy: batches, one step, evaluation.

Three regimes (study 000, 001, 003): full-batch node classification, Cluster-GCN subgraph
mini-batches, and image mini-batches. Strategies compose these; the maths lives here once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import nn

from gnnpar.data.datasets import GraphDataset, ImageDataset
from gnnpar.metrics import loss_fn, score


def image_batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches in a seeded random order (seed None: in order, for evaluation)."""
    n = x.size(0)
    if seed is None:
        order = torch.arange(n)
    else:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    for i in range(0, n, batch_size):
        idx = order[i : i + batch_size]
        yield x[idx], y[idx]


def graph_loss(model: nn.Module, batch, multilabel: bool) -> torch.Tensor:
    """Loss over the training nodes of a graph batch (full graph or subgraph)."""
    out = model(batch.x, batch.edge_index)
    mask = batch.train_mask
    return loss_fn(out[mask], batch.y[mask], multilabel)


def image_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return loss_fn(model(x), y, False)


@torch.no_grad()
def evaluate_graph(model: nn.Module, ds: GraphDataset) -> tuple[dict[str, float], float]:
    """Full-graph inference; scores on the val and test masks, and the seconds it took."""
    model.eval()
    t0 = time.perf_counter()
    data = ds.data
    out = model(data.x, data.edge_index)
    scores = {
        split: score(out[data[f"{split}_mask"]], data.y[data[f"{split}_mask"]], ds.multilabel)
        for split in ("train", "val", "test")
    }
    model.train()
    return scores, time.perf_counter() - t0


@torch.no_grad()
def evaluate_images(
    model: nn.Module, ds: ImageDataset, batch_size: int, max_steps: int | None = None
) -> tuple[dict[str, float], list[float]]:
    """Scores on val and test in mini-batches, and the time of each test mini-batch."""
    model.eval()
    scores, test_times = {}, []
    for split in ("val", "test"):
        x, y = getattr(ds, f"{split}_x"), getattr(ds, f"{split}_y")
        correct, seen = 0, 0
        for step, (bx, by) in enumerate(image_batches(x, y, batch_size, None)):
            if max_steps is not None and step >= max_steps:
                break
            t0 = time.perf_counter()
            out = model(bx)
            if split == "test":
                test_times.append(time.perf_counter() - t0)
            correct += int((out.argmax(-1) == by).sum())
            seen += by.numel()
        scores[split] = correct / max(seen, 1)
    model.train()
    return scores, test_times
