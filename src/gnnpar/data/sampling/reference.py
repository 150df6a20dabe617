"""A straightforward per-node neighbour sampler: the oracle the tests check
:class:`~gnnpar.data.sampling.sampler.NeighborSampler` against, and the baseline of
``benchmarks/kernels/sampler_vs_reference.py``. Training never uses it.
"""

from __future__ import annotations

import torch

from gnnpar.data.sampling.sampler import CSRGraph, SampledBatch


def reference_sample(
    csr: CSRGraph, seeds: torch.Tensor, fanouts: list[int], gen: torch.Generator
) -> SampledBatch:
    """A straightforward per-node sampler (Python loop, one ``randperm`` per node, a dict for
    relabelling) without replacement: the baseline of ``benchmarks/kernels/sampler_vs_reference.py`` and an
    independent check of :class:`NeighborSampler` in the tests."""
    local: dict[int, int] = {int(s): i for i, s in enumerate(seeds.tolist())}
    n_id = list(local)
    frontier = list(n_id)
    rows: list[int] = []
    cols: list[int] = []
    num_nodes, num_edges = [len(n_id)], []
    rowptr, col = csr.rowptr.tolist(), csr.col
    for fanout in fanouts:
        nxt: list[int] = []
        edges_before = len(rows)
        for v in frontier:
            a, b = rowptr[v], rowptr[v + 1]
            nbrs = col[a:b]
            if 0 <= fanout < b - a:
                nbrs = nbrs[torch.randperm(b - a, generator=gen)[:fanout]]
            for u in nbrs.tolist():
                if u not in local:
                    local[u] = len(n_id)
                    n_id.append(u)
                    nxt.append(u)
                rows.append(local[u])
                cols.append(local[v])
        num_nodes.append(len(nxt))
        num_edges.append(len(rows) - edges_before)
        frontier = nxt
    return SampledBatch(
        torch.tensor(n_id, dtype=torch.long),
        torch.tensor([rows, cols], dtype=torch.long).view(2, -1),
        len(seeds),
        num_nodes,
        num_edges,
    )
