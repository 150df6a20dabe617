"""BlockModel: ``stem -> blocks -> head``, the shape every gnnpar model has."""

from __future__ import annotations

import torch
from torch import nn


class BlockModel(nn.Module):
    """A model as an ordered list of blocks, so pipelines can cut between any two of them.

    ``stem`` runs before the first block (first pipeline stage), ``head`` after the last
    (last stage; the readout of study 000). Each block maps ``(x, edge_index) -> x``.
    """

    def __init__(
        self, blocks: list[nn.Module], head: nn.Module | None = None, stem: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.stem = stem if stem is not None else nn.Identity()
        self.blocks = nn.ModuleList(blocks)
        self.head = head if head is not None else nn.Identity()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor | None = None) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, edge_index)
        return self.head(x)


class LogSoftmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=-1)


def output_head(multilabel: bool) -> nn.Module:
    """Log-softmax for single-label data (cross-entropy of it is unchanged); raw logits for BCE."""
    return nn.Identity() if multilabel else LogSoftmax()
