"""GAT (Velickovic et al., ICLR 2018) as study 001 uses it, and the 3-layer variant of study 002.

``gat``: dropout 0.6 -> GATConv(8 heads x 8, concat) -> ELU -> dropout 0.6 -> GATConv(8 heads,
averaged) -> log-softmax. ``gat3``: 3 GATConv layers x 16 hidden, 1 head, dropout 0.6.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GATConv

from gnnpar.models.base import BlockModel, output_head


class GATBlock(nn.Module):
    def __init__(
        self, in_dim: int, out_dim: int, heads: int, concat: bool, dropout: float, last: bool
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv = GATConv(in_dim, out_dim, heads=heads, concat=concat, dropout=dropout)
        self.last = last

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = nn.functional.dropout(x, self.dropout, self.training)
        x = self.conv(x, edge_index)
        return x if self.last else nn.functional.elu(x)


def build_gat(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    h, heads, p = mcfg.hidden, mcfg.heads, mcfg.dropout
    blocks: list[nn.Module] = []
    dim = in_dim
    for _ in range(mcfg.layers - 1):
        blocks.append(GATBlock(dim, h, heads, True, p, last=False))
        dim = h * heads
    # Output layer: study 001 averages 8 heads (concat=False).
    blocks.append(GATBlock(dim, num_classes, heads, False, p, last=True))
    return BlockModel(blocks, head=output_head(multilabel))


def build_gat3(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    return build_gat(mcfg, in_dim, num_classes, multilabel)
