"""The batch datasets of :class:`gnnpar.lightning.GraphDataModule`, apart from Lightning: loader
workers unpickle them, and a worker imports only torch and gnnpar's sampler (this module does
not import Lightning, nor does ``gnnpar.lightning`` until one of its classes is used).

Each is an indexable dataset over gnnpar's sampler (:class:`gnnpar.data.sampling.loader.
SampledBatches` maps the shared graph once per process) whose item ``i`` is made from the run's
seed and ``i`` alone, so a batch is the same whichever process makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from gnnpar.data.sampling.loader import SampledBatches, _mix


def seeded_perm(n: int, *parts: int) -> torch.Tensor:
    """A permutation of ``range(n)`` from a seed mixed of ``parts``."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(_mix(*parts)))


def eval_batches(idx: torch.Tensor, rank: int, world: int, batch_size: int) -> list[torch.Tensor]:
    """Rank ``rank``'s evaluation batches of the nodes ``idx``: its share ``idx[rank::world]``
    (every node once across the ranks) in the same number of non-empty batches on every rank
    (of about ``batch_size``: at most one more where the shares differ in size)."""
    share = idx[rank::world]
    if share.numel() == 0:
        return []
    steps = max(1, -(-(idx.numel() // world) // batch_size))
    return list(torch.tensor_split(share, steps))


class EvalBatches(SampledBatches):
    """Fixed seed batches (one split's, this rank's share), the same every epoch."""

    def __init__(
        self, path: str, seeds: list[torch.Tensor], fanouts, seed: int, tag: int, rank: int
    ):
        super().__init__(path, torch.empty(0, dtype=torch.long), fanouts, 1, rank, 1, seed, 1)
        self.seed_batches, self.tag = seeds, tag

    def __getitem__(self, i: int):
        seeds = self.seed_batches[int(i)]
        g = self._graph()
        gen = torch.Generator().manual_seed(_mix(self.seed, self.tag, self.rank, int(i)))
        b = g["sampler"].sample(seeds, gen)
        b.x, b.y = torch.index_select(g["x"], 0, b.n_id), g["y"][seeds]
        return b


class PoolBatches(SampledBatches):
    """Batch ``epoch * size + j``: the j-th ``batch_size`` slice of the epoch's seeded shuffle of
    every training node (the gossip work pool's items: each node once per epoch)."""

    def __init__(
        self, path: str, train_idx: torch.Tensor, fanouts, batch_size: int, seed: int, size: int
    ):
        super().__init__(path, train_idx, fanouts, batch_size, 0, 1, seed, size)

    def __getitem__(self, i: int):
        epoch, j = divmod(int(i), self.steps)
        if self._epoch is None or self._epoch[0] != epoch:
            perm = seeded_perm(self.train_idx.numel(), self.seed, epoch, 0x9001)
            self._epoch = (epoch, self.train_idx[perm])
        seeds = self._epoch[1][j * self.batch_size : (j + 1) * self.batch_size]
        g = self._graph()
        gen = torch.Generator().manual_seed(_mix(self.seed, epoch, 0x9002, j))
        b = g["sampler"].sample(seeds, gen)
        b.x, b.y = torch.index_select(g["x"], 0, b.n_id), g["y"][seeds]
        return b


class PartBatches(Dataset):
    """Cluster-GCN batches (in the training process): item ``epoch * steps + step`` is the
    subgraph ``plan(epoch, step)``, relabelled with the ``split``'s nodes first."""

    def __init__(self, graph, plan: Callable[[int, int], int], steps: int, split: str) -> None:
        self.graph, self.plan, self.steps, self.split = graph, plan, steps, split
        self._made: dict[int, Any] = {}

    def __getitem__(self, i: int):
        epoch, step = divmod(int(i), self.steps) if self.steps else (0, int(i))
        part = self.plan(epoch, step)
        if part not in self._made:
            self._made[part] = seeds_first(self.graph.batch(part), f"{self.split}_mask")
        return self._made[part]


def seeds_first(data, mask_key: str):
    """``data`` (an induced subgraph) with the nodes of ``mask_key`` first and ``batch_size``
    their number; the edges keep their order, relabelled (each node sums the same terms in the
    same order)."""
    from torch_geometric.data import Data

    mask = data[mask_key]
    order = torch.cat([mask.nonzero().view(-1), (~mask).nonzero().view(-1)])
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel())
    out = Data(edge_index=inv[data.edge_index], batch_size=int(mask.sum()))
    for key in data.keys():
        value = data[key]
        if key != "edge_index" and torch.is_tensor(value) and value.size(0) == order.numel():
            out[key] = value[order]
    out.num_nodes = order.numel()
    return out


def parts_with(graph, mask_key: str) -> list[int]:
    """The subgraphs of a partitioned graph that hold at least one node of ``mask_key``."""
    mask, ptr = graph.tensors[mask_key], graph.tensors["node_ptr"]
    c = torch.cat([torch.zeros(1, dtype=torch.long), mask.long().cumsum(0)])
    return (c[ptr[1:]] - c[ptr[:-1]]).nonzero().view(-1).tolist()
