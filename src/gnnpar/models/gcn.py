"""GCN (Kipf & Welling, ICLR 2017): dropout -> GCNConv -> ReLU, repeated; PyG's GCNConv."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GCNConv

from gnnpar.models.base import BlockModel, output_head


class GCNBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, dropout: float, last: bool) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv = GCNConv(in_dim, out_dim, cached=False)
        self.last = last

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = nn.functional.dropout(x, self.dropout, self.training)
        x = self.conv(x, edge_index)
        return x if self.last else torch.relu(x)


def build_gcn(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    dims = [in_dim] + [mcfg.hidden] * (mcfg.layers - 1) + [num_classes]
    blocks = [
        GCNBlock(dims[i], dims[i + 1], mcfg.dropout, last=i == mcfg.layers - 1)
        for i in range(mcfg.layers)
    ]
    return BlockModel(blocks, head=output_head(multilabel))
