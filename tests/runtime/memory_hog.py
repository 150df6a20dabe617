"""A user model (``--model tests.runtime.memory_hog:hog``) that takes memory at every forward
pass and keeps it, until the kernel kills its process: a rank that outgrows its memory limit,
for tests/runtime/test_resources_real.py. The footprint check sees a tiny model and lets it run."""

from __future__ import annotations

import torch
from torch import nn

HELD: list[torch.Tensor] = []


class Hog(nn.Module):
    def __init__(self, in_dim: int, num_classes: int) -> None:
        super().__init__()
        self.lin = nn.Linear(in_dim, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for _ in range(4):  # 4 x 64 MiB, every page touched
            HELD.append(torch.ones(16 * 2**20))
        return self.lin(x)


def hog(in_dim: int, num_classes: int, **_: object) -> nn.Module:
    return Hog(in_dim, num_classes)
