"""Models a user would write, for the tests of ``--model module:function`` (tests/models/test_user.py,
tests/e2e/test_user_models.py). Ranks import this module by name (tests.models.user_models)."""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import APPNP


class LinearAPPNP(nn.Module):
    """Two linear layers around an APPNP propagation (Klicpera et al., ICLR 2019): the
    hand-written model of issue 20. Returns raw logits."""

    def __init__(self, in_dim: int, num_classes: int, hidden: int = 16, K: int = 4) -> None:
        super().__init__()
        self.in_dim, self.num_classes, self.hidden, self.K = in_dim, num_classes, hidden, K
        self.lin1 = nn.Linear(in_dim, hidden)
        self.prop = APPNP(K=K, alpha=0.1)
        self.lin2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.lin1(x))
        x = self.prop(x, edge_index)
        return self.lin2(x)


def build(in_dim: int, num_classes: int, hidden: int = 16, K: int = 4) -> nn.Module:
    return LinearAPPNP(in_dim, num_classes, hidden, K)


# ------------------------------------------------------------------ malformed ones (exit 2)
def raises(in_dim: int, num_classes: int) -> nn.Module:
    raise ValueError("no such layer size")


def not_a_module(in_dim: int, num_classes: int) -> str:
    return "a model"


def frozen(in_dim: int, num_classes: int) -> nn.Module:
    model = LinearAPPNP(in_dim, num_classes)
    model.requires_grad_(False)
    return model


def wrong_width(in_dim: int, num_classes: int) -> nn.Module:
    return LinearAPPNP(in_dim, num_classes + 1)


class Broken(nn.Module):
    def __init__(self, in_dim: int, num_classes: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim + 3, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.lin(x)  # in_dim + 3 inputs expected: raises


def broken(in_dim: int, num_classes: int) -> nn.Module:
    return Broken(in_dim, num_classes)
