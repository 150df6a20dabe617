"""GraphSAGE (Hamilton et al., NeurIPS 2017), mean aggregation; PyG's SAGEConv.

Study 002: 3 layers x 256, dropout 0.5. Study 003: 2 hidden layers of 128 (Reddit) / 512 (Amazon).
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import SAGEConv

from gnnpar.models.base import BlockModel, output_head


class SAGEBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, dropout: float, last: bool) -> None:
        super().__init__()
        self.conv = SAGEConv(in_dim, out_dim, aggr="mean")
        self.dropout = dropout
        self.last = last

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = self.conv(x, edge_index)
        if self.last:
            return x
        return nn.functional.dropout(torch.relu(x), self.dropout, self.training)


def build_sage(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    dims = [in_dim] + [mcfg.hidden] * (mcfg.layers - 1) + [num_classes]
    blocks = [
        SAGEBlock(dims[i], dims[i + 1], mcfg.dropout, last=i == mcfg.layers - 1)
        for i in range(mcfg.layers)
    ]
    return BlockModel(blocks, head=output_head(multilabel))
