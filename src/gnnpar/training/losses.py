"""The loss of one batch, per kind of batch, and the step that backpropagates it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gnnpar.models.base import BlockModel
from gnnpar.models.hops import HopGraph


def loss_fn(logits: torch.Tensor, y: torch.Tensor, multilabel: bool) -> torch.Tensor:
    """Cross-entropy for single-label data, BCE-with-logits for multi-label (study 003).

    Always on fp32 logits (``--precision bf16`` computes them in bfloat16)."""
    logits = logits.float()  # a no-op (the same tensor) in fp32
    if multilabel:
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float())
    return torch.nn.functional.cross_entropy(logits, y)


@dataclass
class NoTrainingRows:
    """The loss of a batch with no training node (a Cluster-GCN part of a sparsely labelled
    graph): ``zero`` is 0 x the output, so its backward gives every parameter a zero gradient
    through the model (DDP's hooks and every collective still run), and no loss is reported (the
    mean over no rows is NaN, which made the epoch's loss NaN although no weight was touched)."""

    zero: torch.Tensor


def graph_loss(model: nn.Module, batch, multilabel: bool) -> torch.Tensor | NoTrainingRows:
    """Loss over the training nodes of a graph batch (full graph or subgraph)."""
    out = model(batch.x, batch.edge_index)
    mask = batch.train_mask
    if not bool(mask.any()):
        return NoTrainingRows(out.float().sum() * 0.0)
    return loss_fn(out[mask], batch.y[mask], multilabel)


def seed_loss(
    model: nn.Module, batch, multilabel: bool, free_features: bool = False
) -> torch.Tensor:
    """Loss over the seed nodes of a neighbour-sampled batch (the first ``batch_size`` rows).

    A :class:`~gnnpar.models.base.BlockModel` (under DDP or not) whose blocks all trim gets the
    batch's :class:`~gnnpar.models.hops.HopGraph` when the batch says what it sampled per hop,
    and computes each layer only for the nodes the seeds' outputs depend on (the same seed
    outputs; models/hops.py). Any other model, a user's module with its own forward included,
    gets ``edge_index``.

    ``free_features``: the batch lets go of its features (``batch.x``) once the forward has
    read them, so that before the backward they are held only where autograd saved them
    (GraphSAGE: a copy of its first layer's destination rows). The step's caller must not read
    ``batch.x`` afterwards (the sampled strategy's does not)."""
    logits = seed_logits(model, batch)
    if free_features:
        batch.x = None
    return loss_fn(logits, batch.y, multilabel)


def seed_logits(model: nn.Module, batch) -> torch.Tensor:
    """The model's outputs for the seed nodes of a neighbour-sampled batch (see
    :func:`seed_loss`; sampled evaluation scores them)."""
    hops = HopGraph.of(batch)
    inner = getattr(model, "module", model)  # DistributedDataParallel wraps the model
    trims = (
        hops is not None
        and isinstance(inner, BlockModel)
        and type(inner).forward is BlockModel.forward
        and inner.trims(hops)
    )
    return model(batch.x, hops if trims else batch.edge_index)[: batch.batch_size]


def image_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], device) -> torch.Tensor:
    x, y = batch
    return loss_fn(model(x.to(device)), y.to(device), False)


class LocalStep:
    """Forward and backward of one batch on this rank: ``loss(net, batch)``, then backward.
    Returns the loss (detached)."""

    def __init__(self, net: nn.Module, loss: Callable[[nn.Module, Any], torch.Tensor]) -> None:
        self.net, self.loss = net, loss

    def __call__(self, batch: Any) -> torch.Tensor | None:
        loss = self.loss(self.net, batch)
        if isinstance(loss, NoTrainingRows):
            loss.zero.backward()
            return None
        loss.backward()
        return loss.detach()
