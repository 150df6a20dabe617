"""A graph-free baseline for ``gnnpar train --model benchmarks.datasets._features_only:mlp``: an
MLP of the shape of study 002's GraphSAGE (``--layers`` linear layers of ``--hidden`` units,
ReLU, dropout before each) that reads each node's features and ignores ``edge_index``, so it
scores what the features alone carry, trained by the same loop, optimiser and evaluation as the
GNNs it is compared with."""

from __future__ import annotations

import torch
from torch import nn


class FeaturesOnly(nn.Module):
    def __init__(self, in_dim: int, num_classes: int, hidden: int, layers: int, dropout: float):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [num_classes]
        blocks: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            blocks += [nn.Dropout(dropout), nn.Linear(a, b)]
            if i < layers - 1:
                blocks.append(nn.ReLU())
        self.net = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def mlp(
    in_dim: int, num_classes: int, hidden: int = 256, layers: int = 3, dropout: float = 0.5
) -> nn.Module:
    return FeaturesOnly(in_dim, num_classes, hidden, layers, dropout)
