"""Node partitions for Cluster-GCN mini-batches (Chiang et al., KDD 2019; study 003 algorithm 2).

``random_partition`` assigns every node to one of ``n`` parts uniformly at random (study 003
algorithm 2); each mini-batch is the subgraph induced by one part (edges between parts dropped).
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.utils import subgraph


def random_partition(num_nodes: int, num_parts: int, seed: int) -> torch.Tensor:
    """part[i] in [0, num_parts): a balanced random assignment (a permutation split evenly)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_nodes, generator=g)
    part = torch.empty(num_nodes, dtype=torch.long)
    part[perm] = torch.arange(num_nodes) % num_parts
    return part


def part_nodes(part: torch.Tensor, num_parts: int) -> list[torch.Tensor]:
    """Sorted node ids of each part."""
    order = torch.argsort(part, stable=True)
    counts = torch.bincount(part, minlength=num_parts).tolist()
    return list(torch.split(order, counts))


def induced_batch(data: Data, nodes: torch.Tensor) -> Data:
    """The subgraph induced by ``nodes`` with features, labels and masks (relabelled 0..n-1)."""
    edge_index, _ = subgraph(nodes, data.edge_index, relabel_nodes=True, num_nodes=data.num_nodes)
    batch = Data(x=data.x[nodes], edge_index=edge_index, y=data.y[nodes])
    for key in ("train_mask", "val_mask", "test_mask"):
        if key in data:
            batch[key] = data[key][nodes]
    batch.n_id = nodes
    return batch


def build_partition_batches(cfg, ds) -> tuple[list[Data], float]:
    """Partition the graph per ``cfg.data`` and build one induced subgraph per part.

    Returns the batches and the seconds spent (reported as partition_time_s, never train time).
    """
    import time

    t0 = time.perf_counter()
    n = cfg.data.partitions
    part = random_partition(ds.num_nodes, n, cfg.run.seed)
    batches = [induced_batch(ds.data, nodes) for nodes in part_nodes(part, n)]
    return batches, time.perf_counter() - t0
