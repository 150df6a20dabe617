"""A graph whose features are most of its bytes (``--dataset tests.runtime.wide_graph:wide``):
200,000 nodes with 2,048 fp32 features (1.64 GB), a random graph of 8 in-edges a node, 4
classes that the features and the neighbours both carry, and masks of 1,024 training, 512
validation and 512 test nodes. Prepared, its folder is 1.53 GiB: 1.5x the memory
cgroup of tests/runtime/test_resources_real.py that trains and evaluates from it."""

from __future__ import annotations

import torch
from torch_geometric.data import Data

NODES = 200_000
WIDTH = 2048
DEGREE = 8


def wide(seed: int = 0, **_: object) -> Data:
    g = torch.Generator().manual_seed(1234)
    y = torch.randint(0, 4, (NODES,), generator=g)
    # features: noise plus a class signal in the first 16 columns
    x = torch.randn(NODES, WIDTH, generator=g)
    x[:, :16] += 0.5 * torch.nn.functional.one_hot(y, 4).repeat(1, 4).float()
    # edges: half to a node of the same class, half anywhere
    dst = torch.arange(NODES).repeat_interleave(DEGREE)
    anywhere = torch.randint(0, NODES, (NODES * DEGREE,), generator=g)
    order = torch.argsort(y, stable=True)
    counts = torch.bincount(y, minlength=4)
    start = torch.cumsum(counts, 0) - counts
    pick = (torch.rand(NODES * DEGREE, generator=g) * counts[y[dst]]).long()
    same = order[start[y[dst]] + pick]
    src = torch.where(torch.arange(NODES * DEGREE) % 2 == 0, same, anywhere)
    perm = torch.randperm(NODES, generator=g)
    masks = {}
    for name, (a, b) in {"train": (0, 1024), "val": (1024, 1536), "test": (1536, 2048)}.items():
        m = torch.zeros(NODES, dtype=torch.bool)
        m[perm[a:b]] = True
        masks[f"{name}_mask"] = m
    return Data(x=x, edge_index=torch.stack([src, dst]), y=y, **masks)
