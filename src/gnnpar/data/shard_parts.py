"""Cluster-GCN's subgraphs of a sharded graph (:mod:`gnnpar.data.shards`): every part lies
within one shard, so a host that holds only its shard builds its own parts alone.

``--partitions P`` over ``H`` shards: shard ``h`` gets ``P_h = P // H`` parts (one more for each
of the first ``P % H`` shards), numbered ``offset_h .. offset_h + P_h - 1`` with ``offset_h =
P_0 + ... + P_{h-1}``. Shard h's nodes are split by ``--partitioner`` (METIS over the subgraph
its nodes induce, or random), seeded with :func:`shard_seed`. An edge between two shards joins
two parts, and Cluster-GCN drops every edge between parts (Chiang et al., KDD 2019), so no host
needs another's structure to build its parts.

The same subgraphs are built two ways:

* :func:`host_parts`: a host holding only shard h, from its shard's CSR (renumbered ids);
* :func:`whole_graph_parts`: a host holding every shard, over the unsharded graph in its
  original ids (:func:`gnnpar.data.shards.load_sharded`).

Within a shard, renumbered ids ascend with the original ids (``shards.write_shards`` orders a
shard's nodes by original id) and METIS gets the same induced graph (its symmetric closure is
canonical: sorted, without duplicates), so part p holds the same nodes in the same order, the
same edges in the same order, and the same features, labels and masks either way
(``tests/data/test_shard_parts.py``).

Dealing (:func:`deal_by_host`): the parts of shard h go to the ranks of the host that holds it
(a seeded permutation of them, dealt round-robin over the host's ranks, as
:func:`gnnpar.training.sources.assign_parts` deals all parts over all ranks).

    gnnpar prepare --dataset cora --shards 2 --out cora-2
    torchrun --nnodes 2 ... -m gnnpar train --dataset cora-2 --strategy allreduce --partitions 8
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from gnnpar.data.partition import PartitionedGraph, build_partitioned, partition_nodes
from gnnpar.errors import UsageError


def parts_per_shard(partitions: int, shards: int) -> list[int]:
    """``P_h`` of every shard: ``P // H``, one more for the first ``P % H`` shards."""
    if partitions < shards:
        raise UsageError(
            f"--partitions {partitions} is fewer than the graph's {shards} shards: Cluster-GCN's "
            "parts of a sharded graph lie within shards, at least one per shard. Raise "
            "--partitions."
        )
    base, extra = divmod(partitions, shards)
    return [base + (h < extra) for h in range(shards)]


def offsets(sizes: list[int]) -> list[int]:
    """The first global part id of every shard's parts."""
    return [sum(sizes[:h]) for h in range(len(sizes))]


def shard_seed(seed: int, h: int) -> int:
    """The partitioner's seed for shard ``h``: its own per shard, the same on every host."""
    return seed * 1009 + h


def _split(method: str, edge_index: torch.Tensor, n: int, parts: int, seed: int) -> torch.Tensor:
    if parts > n:
        raise UsageError(
            f"a shard of {n} nodes cannot be split into {parts} non-empty partitions. Use fewer "
            "--partitions."
        )
    return partition_nodes(method, edge_index, n, parts, seed)


def shard_data(rowptr, col, x, y, splits: dict, first: int, end: int) -> Data:  # noqa: ANN001
    """One shard as a graph of its own nodes (local ids ``0 .. end - first - 1``): the in-edges
    whose source it holds too, features as float32, labels and the three masks."""
    n = end - first
    col = torch.as_tensor(np.asarray(col), dtype=torch.long)
    dst = torch.repeat_interleave(torch.arange(n), torch.diff(torch.as_tensor(rowptr)))
    inside = (col >= first) & (col < end)
    data = Data(edge_index=torch.stack([col[inside] - first, dst[inside]]), num_nodes=n)
    data.x = torch.as_tensor(x).float()
    data.y = torch.as_tensor(np.asarray(y))
    for name in ("train", "val", "test"):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.as_tensor(splits[name]) - first] = True
        data[f"{name}_mask"] = mask
    return data


def host_parts(
    graph, h: int, partitions: int, method: str, seed: int
) -> tuple[PartitionedGraph, int, list[int]]:
    """Host h's parts from its shard alone (``graph``: a
    :class:`gnnpar.data.sampling.distributed.ShardGraph`): (the parts, numbered from 0, their
    first global id, every shard's part count)."""
    sizes = parts_per_shard(partitions, int(graph.bounds.numel()) - 1)
    data = shard_data(
        graph.rowptr, graph.col, graph.x, graph.y, graph.splits, graph.first, graph.end
    )
    part = _split(method, data.edge_index, data.num_nodes, sizes[h], shard_seed(seed, h))
    return build_partitioned(data, part, sizes[h]), offsets(sizes)[h], sizes


def whole_graph_parts(
    data: Data, folder: str | Path, partitions: int, method: str, seed: int
) -> tuple[PartitionedGraph, list[int]]:
    """Every shard's parts over the unsharded graph ``data`` (original ids) of the sharded
    ``folder`` (its shards' ``orig_ids.npy`` say which nodes each holds): (the parts, every
    shard's part count)."""
    from gnnpar.data.shards import open_shards

    shards = open_shards(folder)
    sizes = parts_per_shard(partitions, len(shards))
    n = int(data.num_nodes)
    part = torch.empty(n, dtype=torch.long)
    for h, (s, at) in enumerate(zip(shards, offsets(sizes), strict=True)):
        nodes = torch.from_numpy(np.asarray(s.array("orig_ids"), dtype=np.int64))  # ascending
        edge_index, _ = subgraph(nodes, data.edge_index, relabel_nodes=True, num_nodes=n)
        local = _split(method, edge_index, nodes.numel(), sizes[h], shard_seed(seed, h))
        part[nodes] = local + at
    return build_partitioned(data, part, partitions), sizes


def deal_by_host(
    sizes: list[int], host_of_rank: list[int], seed: int
) -> tuple[list[list[int]], int]:
    """The global part ids each rank trains (shard h's parts to host h's ranks) and the steps
    every rank runs per epoch (the most any rank holds). UsageError where a host has more ranks
    than parts (a rank without a subgraph)."""
    mine: list[list[int]] = [[] for _ in host_of_rank]
    steps = 0
    for h, (size, at) in enumerate(zip(sizes, offsets(sizes), strict=True)):
        ranks = [r for r, host in enumerate(host_of_rank) if host == h]
        if size < len(ranks):
            raise UsageError(
                f"shard {h} has {size} of the --partitions, fewer than its host's {len(ranks)} "
                "ranks: every rank needs at least one subgraph of its own host's shard. Raise "
                "--partitions."
            )
        g = torch.Generator().manual_seed(seed * 1_000_003 + h)
        perm = (torch.randperm(size, generator=g) + at).tolist()
        for i, r in enumerate(ranks):
            mine[r] = perm[i :: len(ranks)]
            steps = max(steps, len(mine[r]))
    return mine, steps
