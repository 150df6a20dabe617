"""GCN (Kipf & Welling, ICLR 2017): dropout -> GCNConv -> ReLU, repeated; PyG's GCNConv.

The first block takes its input dropout and projection from :class:`SparseInputLinear` (see
``models/gat.py``): bag-of-words features such as Cora's are ~99% zeros, so dropping out only the
non-zeros and multiplying in CSR form is the same computation at a fraction of the cost.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GCNConv

from gnnpar.models.base import BlockModel, output_head
from gnnpar.models.gat import SparseInputLinear, dropout


class GCNBlock(nn.Module):
    def __init__(
        self, in_dim: int, out_dim: int, p: float, last: bool, sparse_input: bool = False
    ) -> None:
        super().__init__()
        self.dropout = p
        self.conv = GCNConv(in_dim, out_dim, cached=False)
        self.last = last
        self.sparse_input = sparse_input
        if sparse_input:
            lin = SparseInputLinear(in_dim, out_dim, p)
            lin.weight = self.conv.lin.weight  # keep GCNConv's own initialisation
            self.conv.lin = lin

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        if not self.sparse_input:
            x = dropout(x, self.dropout, self.training)
        x = self.conv(x, edge_index)
        return x if self.last else torch.relu(x)


def build_gcn(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    dims = [in_dim] + [mcfg.hidden] * (mcfg.layers - 1) + [num_classes]
    blocks = [
        GCNBlock(dims[i], dims[i + 1], mcfg.dropout, last=i == mcfg.layers - 1, sparse_input=i == 0)
        for i in range(mcfg.layers)
    ]
    return BlockModel(blocks, head=output_head(multilabel))
