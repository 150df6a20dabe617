"""Hand-written user models for the tests of gnnpar.models.adapt (cutting a model into blocks;
tests/models/user_models.py has the models the training tests import by name).

``APPNPNet`` is two linear layers around an APPNP propagation (Gasteiger et al., ICLR 2019):
nothing gnnpar can cut by itself, so pipelines need ``--split-at prop`` (or ``lin2``).
``BlocksNet`` exposes ``stem``, ``blocks`` and ``head`` and runs them in that order: cut by
itself. ``SkipNet`` reads its input again at the end: no cut has one value crossing it.
``MisleadingBlocksNet`` has ``blocks`` but adds each block's output to its input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import APPNP, GCNConv


class APPNPNet(nn.Module):
    def __init__(
        self, in_dim: int, num_classes: int, hidden: int = 16, K: int = 3, dropout: float = 0.5
    ) -> None:
        super().__init__()
        self.lin1 = nn.Linear(in_dim, hidden)
        self.prop = APPNP(K, alpha=0.1)
        self.lin2 = nn.Linear(hidden, num_classes)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, self.dropout, self.training)  # functional: self.training is read
        x = F.relu(self.lin1(x))
        x = self.prop(x, edge_index)
        return self.lin2(x)


class _ConvReLU(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = GCNConv(dim, dim)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x, edge_index))


class BlocksNet(nn.Module):
    def __init__(self, in_dim: int, num_classes: int, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.stem = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(_ConvReLU(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x, edge_index)
        return self.head(x)


class SkipNet(APPNPNet):
    """Reads its input again at the end: every cut has two values crossing it."""

    def __init__(self, in_dim: int, num_classes: int, **kwargs) -> None:
        super().__init__(in_dim, num_classes, **kwargs)
        self.skip = nn.Linear(in_dim, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.lin1(x))
        return self.lin2(self.prop(h, edge_index)) + self.skip(x)


class MisleadingBlocksNet(BlocksNet):
    """Has ``blocks`` but does not run stem -> blocks -> head: the cut must be refused."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x, edge_index)
        return self.head(x)


class TwiceNet(APPNPNet):
    """Applies ``mid`` before and after the propagation: cut at prop, its weights would sit
    on two stages."""

    def __init__(self, in_dim: int, num_classes: int, **kwargs) -> None:
        super().__init__(in_dim, num_classes, **kwargs)
        self.mid = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = self.mid(F.relu(self.lin1(x)))
        h = self.mid(self.prop(h, edge_index))
        return self.lin2(h)


class InPlaceNet(APPNPNet):
    """Its second part starts with an in-place activation."""

    def __init__(self, in_dim: int, num_classes: int, **kwargs) -> None:
        super().__init__(in_dim, num_classes, **kwargs)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.prop(self.act(self.lin1(x)), edge_index))
