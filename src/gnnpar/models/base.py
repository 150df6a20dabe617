"""BlockModel: ``stem -> blocks -> head``, the shape every gnnpar model has."""

from __future__ import annotations

import torch
from torch import nn

from gnnpar.models.hops import HopGraph


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

    def forward(self, x: torch.Tensor, edge_index=None) -> torch.Tensor:
        """``edge_index``: a tensor (every block runs on the whole graph), or a neighbour-sampled
        batch's :class:`~gnnpar.models.hops.HopGraph`: then, if every block trims (has
        ``trims = True``: takes a :class:`~gnnpar.models.hops.HopLayer` and returns its
        ``n_dst`` rows), block ``l`` runs on the nodes within ``L - l`` hops of the seeds and the
        output has the seeds' rows only; otherwise every block gets the whole ``edge_index``."""
        x = self.stem(x)
        if isinstance(edge_index, HopGraph):
            if self.trims(edge_index):
                n = len(self.blocks)
                for i, block in enumerate(self.blocks):
                    layer = edge_index.layer(i, n)
                    x = block(x if x.size(0) == layer.n_src else x[: layer.n_src], layer)
                return self.head(x)
            edge_index = edge_index.edge_index
        for block in self.blocks:
            x = block(x, edge_index)
        return self.head(x)

    def trims(self, graph: HopGraph) -> bool:
        """Whether a forward on ``graph`` runs each block on its own layer's trimmed graph."""
        return 0 < len(self.blocks) <= graph.hops and all(
            getattr(b, "trims", False) for b in self.blocks
        )


class LogSoftmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=-1)


def output_head(multilabel: bool) -> nn.Module:
    """Log-softmax for single-label data (cross-entropy of it is unchanged); raw logits for BCE."""
    return nn.Identity() if multilabel else LogSoftmax()
