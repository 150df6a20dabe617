"""GraphSAGE (Hamilton et al., NeurIPS 2017), mean aggregation; PyG's SAGEConv.

Study 002: 3 layers x 256, dropout 0.5. Study 003: 2 hidden layers of 128 (Reddit) / 512 (Amazon).

On a whole graph (``edge_index`` a tensor) a block is PyG's ``SAGEConv``. On a neighbour-sampled
batch's layer (:class:`~gnnpar.models.hops.HopLayer`) it computes the same function of the
same parameters on the trimmed graph of its layer, the way DGL's ``SAGEConv`` does:

* the mean over in-neighbours is one CSR product (:func:`~gnnpar.models.hops.mean_aggregate`)
  instead of PyG's gather of one row per edge plus a scatter;
* ``mean_j W x_j = W mean_j x_j``: when the output is narrower than the input, and the input
  needs a gradient (hidden layers only: the first layer's input, the features, needs none),
  it projects first and aggregates the narrower rows (:func:`project_first`);
* the dropout mask is drawn from a counter-based hash (:func:`gnnpar.models.dropout.dropout`:
  the same distribution as ``F.dropout``, ~5x cheaper on CPU) for the layer's output rows only.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch_geometric.nn import SAGEConv

from gnnpar.models.base import BlockModel, output_head
from gnnpar.models.dropout import relu_dropout
from gnnpar.models.hops import HopLayer, mean_aggregate
from gnnpar.models.reused import ReusedRows

# below this, the step's tensors are small blocks that the heap serves well
REUSE_MIN_BYTES = 1 << 20


def project_first(x: torch.Tensor, in_dim: int, out_dim: int) -> bool:
    """Aggregate ``W x`` (out_dim columns) rather than ``x`` (in_dim columns)?

    Projecting first costs a product over every source row instead of the destination rows, and
    an aggregation's backward when ``x`` needs no gradient of its own; it pays when the rows it
    aggregates are narrower and ``x`` needs the gradient anyway (a hidden layer)."""
    return out_dim < in_dim and x.requires_grad


class SAGEBlock(nn.Module):
    trims = True  # runs on a HopLayer (see gnnpar.models.base.BlockModel.forward)

    def __init__(self, in_dim: int, out_dim: int, dropout: float, last: bool) -> None:
        super().__init__()
        self.conv = SAGEConv(in_dim, out_dim, aggr="mean")
        self.dropout = dropout
        self.last = last
        # a training step's first-layer tensors of a batch's size, in blocks reused by the
        # next steps (gnnpar.models.reused: the heap kept growing around them)
        self._reused = {"x_dst": ReusedRows(), "agg": ReusedRows()}

    def train(self, mode: bool = True) -> SAGEBlock:
        if not mode:  # evaluation runs without them: their memory goes back
            for rows in self._reused.values():
                rows.release()
        return super().train(mode)

    def _reusing(self, x: torch.Tensor) -> bool:
        """A training step's float32 input of at least :data:`REUSE_MIN_BYTES` on the CPU."""
        return (
            self.training
            and torch.is_grad_enabled()
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and x.numel() * 4 >= REUSE_MIN_BYTES
        )

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        if isinstance(edge_index, HopLayer):
            return self._forward_layer(x, edge_index)
        x = self.conv(x, edge_index)
        if self.last:
            return x
        return F.dropout(torch.relu(x), self.dropout, self.training)

    def _forward_layer(self, x: torch.Tensor, layer: HopLayer) -> torch.Tensor:
        """SAGEConv's ``lin_l(mean_j x_j) + lin_r(x_i)`` for the layer's ``n_dst`` rows."""
        lin_l, lin_r = self.conv.lin_l, self.conv.lin_r
        adj = layer.mean_adjacency()
        x_dst = x[: layer.n_dst]
        if torch.is_grad_enabled() and not x.requires_grad and x.size(0) > layer.n_dst:
            # lin_r's weight gradient reads x_dst: saved as a view, it would keep all of x (the
            # batch's features, 4.6x x_dst's rows at papers100m 0.05, 15-10-5) for the backward
            if self._reusing(x):
                x_dst = self._reused["x_dst"].take(*x_dst.shape).copy_(x_dst)
            else:
                x_dst = x_dst.clone()
        if project_first(x, lin_l.in_channels, lin_l.out_channels):
            # the bias after the mean: a node without neighbours gets lin_l(0) = bias, as in PyG
            agg = mean_aggregate(F.linear(x, lin_l.weight), adj)
            out = torch.add(agg, F.linear(x_dst, lin_r.weight, lin_l.bias))
        else:
            # added into lin_r's output (addmm_: the same product and sum as torch.addmm,
            # without a second [n_dst, out] tensor; linear's backward does not read its output)
            out = F.linear(x_dst, lin_r.weight, lin_l.bias)
            agg = mean_aggregate(x, adj, self._reused["agg"] if self._reusing(x) else None)
            if out.dtype == agg.dtype == lin_l.weight.dtype:
                out.addmm_(agg, lin_l.weight.t())
            else:  # under autocast (bf16): torch.addmm casts its arguments, addmm_ does not
                out = torch.addmm(out, agg, lin_l.weight.t())
        if self.last:
            return out
        # over ``out`` (neither add's nor addmm's backward reads it): no ReLU and dropout copies
        return relu_dropout(out, self.dropout, self.training)


def build_sage(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    dims = [in_dim] + [mcfg.hidden] * (mcfg.layers - 1) + [num_classes]
    blocks = [
        SAGEBlock(dims[i], dims[i + 1], mcfg.dropout, last=i == mcfg.layers - 1)
        for i in range(mcfg.layers)
    ]
    return BlockModel(blocks, head=output_head(multilabel))
