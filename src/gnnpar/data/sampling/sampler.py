"""Neighbour sampling over a CSR graph (GraphSAGE mini-batches, study 002).

Two implementations of one sampler. The default is a compiled hop kernel (``sampler_kernel.c``,
plain C that pip compiles when it installs gnnpar, called through ctypes): per hop, for each
frontier node, Floyd's algorithm draws ``fanout`` distinct neighbours (direct draws with
replacement) from a splitmix64 stream, and a second pass reads the neighbours with prefetching
and relabels them with the node-mark array. Profiling the torch version (torch.profiler,
synthetic-reddit 0.1, fan-outs 25-10-10, one thread) found half the time in gathers
(``aten::index``: row starts, neighbour ids, mark lookups, masks), ~20% in sorts (the rejection
sampler's repeat check, random keys), ~10% in concatenation and ~8% in ``nonzero``: many passes
over the sampled edges, none dominant, so no better torch formulation fixes it; fused into one
pass per hop it runs ~4x faster, ahead of DGL's and pyg-lib's C++ samplers on the same work
(BENCHMARKS.md, ``benchmarks/frameworks/sampler_vs_peers.py``). Finding and loading it is
:mod:`gnnpar.data.sampling.kernel`'s (why C through ctypes, too). The vectorised-torch version
below stays as the fallback when the kernel is not built; it draws a different random stream.

A mini-batch has the shape PyG's ``NeighborLoader`` returns, so PyG layers consume it unchanged:

* ``n_id``: global ids of the sampled nodes; the ``batch_size`` seed nodes come first, then the
  nodes first reached at hop 1, hop 2, ... (each node appears once);
* ``edge_index`` [2, E]: sampled edges relabelled to positions in ``n_id``, ``source -> target``
  (row 0 is the neighbour, row 1 the node that aggregates it: PyG's ``source_to_target`` flow);
* ``batch_size``: the number of seeds; the loss and metrics use only ``out[:batch_size]``.

Hop ``k`` samples, for every node first reached at hop ``k-1`` (the seeds for ``k=1``), up to
``fanouts[k-1]`` of its incoming neighbours (``-1``: all of them). Without replacement each of a
node's ``min(deg, fanout)`` neighbours is distinct (a uniform random subset: random keys, one sort
by ``(row, key)``, the first ``fanout`` of each row; for rows with many more neighbours than
``fanout``, ``fanout`` draws with the repeats drawn again, O(fanout) instead of O(degree)); with replacement each node draws exactly
``fanout`` neighbours uniformly (PyG's ``replace=True``). With ``fanouts = [-1] * L`` the batch is
the exact L-hop in-neighbourhood of the seeds, so an L-layer GNN gives the seeds the same outputs
as full-graph inference. Every random number comes from the ``torch.Generator`` passed in (the
kernel draws one 63-bit seed per hop from it), so the same seed gives the same batches. In the
kernel a node's draws are keyed by (the hop's seed, the node's original id), not by its place in
the frontier, so the process that owns a node's shard draws the same neighbours for it as one
process over the unsharded graph (:mod:`gnnpar.data.sampling.distributed`).

Relabelling uses node-mark arrays of size ``num_nodes`` owned by the sampler (reset after each
batch, touching only the nodes it marked) instead of ``torch.unique`` over the sampled ids: a
scatter plus a gather is O(sampled) and keeps nodes in order of first appearance.

    from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
    csr = CSRGraph.from_edge_index(data.edge_index, data.num_nodes)
    batch = NeighborSampler(csr, [25, 10, 10]).sample(seeds, torch.Generator().manual_seed(0))
    out = model(data.x[batch.n_id], batch.edge_index)[: batch.batch_size]
"""

from __future__ import annotations

import ctypes
import warnings
from dataclasses import dataclass

import torch

from gnnpar.csr import indptr
from gnnpar.data.sampling import kernel
from gnnpar.errors import UsageError

_UNSEEN = torch.iinfo(torch.long).max


@dataclass
class CSRGraph:
    """Incoming adjacency: the in-neighbours of node ``v`` are ``col[rowptr[v]:rowptr[v + 1]]``."""

    rowptr: torch.Tensor  # [N + 1] int64
    col: torch.Tensor  # [E] int64 (or int32), source node of each edge, grouped by target node

    @property
    def num_nodes(self) -> int:
        return self.rowptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_nodes: int) -> CSRGraph:
        """Group edges ``source -> target`` by target, so row ``v`` lists what ``v`` aggregates."""
        src, dst = edge_index[0].long(), edge_index[1].long()
        # stable sort keeps the original order of a node's neighbours (deterministic batches)
        order = torch.sort(dst, stable=True).indices
        return cls(indptr(dst, num_nodes), src[order].contiguous())

    def share_memory_(self) -> CSRGraph:
        self.rowptr.share_memory_()
        self.col.share_memory_()
        return self


@dataclass
class SampledBatch:
    n_id: torch.Tensor  # [n] global node ids, seeds first
    edge_index: torch.Tensor  # [2, E] local ids, source -> target
    batch_size: int  # number of seeds (the first rows of n_id)
    num_sampled_nodes: list[int]  # nodes added per hop (hop 0 = seeds), as PyG reports them
    num_sampled_edges: list[int]  # edges sampled per hop
    x: torch.Tensor | None = None  # features of n_id (filled by SampledBatches)
    y: torch.Tensor | None = None  # labels of the seeds
    # a prepared graph's feature reads (SampledBatches): rows served by the feature cache, rows
    # and bytes read from the folder (in the stored dtype); 0 for an in-memory graph
    cache_hits: int = 0
    rows_read: int = 0
    bytes_read: int = 0

    def to_data(self):  # -> torch_geometric.data.Data
        """The batch as the PyG ``Data`` a ``NeighborLoader`` yields (imported here, so that
        loader workers, which only build SampledBatch objects, never import PyG)."""
        from torch_geometric.data import Data

        return Data(
            x=self.x,
            y=self.y,
            edge_index=self.edge_index,
            n_id=self.n_id,
            batch_size=self.batch_size,
            num_sampled_nodes=self.num_sampled_nodes,
            num_sampled_edges=self.num_sampled_edges,
        )

    @property
    def num_nodes(self) -> int:
        return self.n_id.numel()


def _ranges(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Concatenation of ``arange(s, s + c)`` for every (s, c), without a Python loop."""
    total = int(counts.sum())
    if total == 0:
        return torch.empty(0, dtype=torch.long)
    offsets = torch.cumsum(counts, 0) - counts  # where each range begins in the output
    rep_start = torch.repeat_interleave(starts - offsets, counts, output_size=total)
    return rep_start + torch.arange(total)


def _draw(u: torch.Tensor, deg: torch.Tensor) -> torch.Tensor:
    """Uniform integers in [0, deg) from uniform floats in [0, 1)."""
    return (u * deg).long().clamp_max_(deg - 1)  # the clamp only guards float rounding


def _subset_by_keys(
    start: torch.Tensor, deg: torch.Tensor, k: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A uniform k-subset of each row ``[start, start + deg)`` (deg > k): a random key per
    element, one sort by (row, key), the first k of each row. (edge positions, row index)."""
    pos = _ranges(start, deg)
    row = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    # row + key in float64 is one sort; keys in [0, 0.5) so rounding never carries a key into
    # the next row (exact for rows < 2**51)
    keys = row.double() + 0.5 * torch.rand(pos.numel(), generator=gen, dtype=torch.float64)
    order = torch.sort(keys, stable=True).indices
    row_begin = torch.cumsum(deg, 0) - deg
    rank_in_row = torch.arange(pos.numel()) - row_begin[row]  # row is sorted already
    keep = order[rank_in_row < k]
    return pos[keep], row[keep]


def _subset_by_rejection(
    start: torch.Tensor, deg: torch.Tensor, k: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A uniform k-subset of each row (used for deg >= 4k): k uniform draws per row; while a row
    holds a value twice, draw the repeats again. The result is the first k distinct values of a
    sequence of uniform draws, which by symmetry is a uniform k-subset; with deg >= 4k a redraw
    repeats with probability < 1/4, so few rounds are needed, each only over the rows that still
    hold a repeat. (edge positions, row index)."""
    rows = deg.numel()
    if rows == 0:
        return torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
    deg_m = deg[:, None].expand(rows, k)
    idx = _draw(torch.rand(rows, k, generator=gen, dtype=torch.float64), deg_m)
    active = torch.arange(rows)  # rows that may still hold a repeat
    while active.numel():
        sub = idx[active]
        val, order = torch.sort(sub, dim=1)  # k values per row: small row-wise sorts
        repeat = torch.zeros_like(sub, dtype=torch.bool)
        repeat.scatter_(1, order[:, 1:], val[:, 1:] == val[:, :-1])  # copies after the first
        has = repeat.any(dim=1)
        active, sub, repeat = active[has], sub[has], repeat[has]
        u = torch.rand(int(repeat.sum()), generator=gen, dtype=torch.float64)
        sub[repeat] = _draw(u, deg_m[active][repeat])
        idx[active] = sub
    row = torch.arange(rows).repeat_interleave(k)
    idx = idx.view(-1)
    return start[row] + idx, row


class NeighborSampler:
    """Layer-wise uniform neighbour sampling; see the module docstring for the batch layout.

    One sampler per process: it owns two node-mark arrays of ``num_nodes`` entries (int64),
    which is what makes relabelling O(sampled nodes) instead of a sort of every sampled id.

    ``backend``: ``"kernel"`` (the compiled hop kernel, see :func:`_kernel_hop`), ``"torch"``
    (vectorised torch, no compiled code; about 3x slower and with a different random stream), or
    ``"auto"``: the kernel when it is built, else torch with a warning.
    """

    def __init__(
        self, csr: CSRGraph, fanouts: list[int], replace: bool = False, backend: str = "auto"
    ) -> None:
        if any(f == 0 or f < -1 for f in fanouts):
            raise ValueError(f"fanouts must be positive or -1 (all neighbours), got {fanouts}")
        if backend not in ("auto", "kernel", "torch"):
            raise ValueError(f"backend must be auto, kernel or torch, got {backend!r}")
        if backend != "torch" and kernel.load() is None:
            if backend == "kernel":
                raise UsageError(
                    f"the compiled sampler kernel ({kernel.where()}) is "
                    f"missing or out of date: {kernel.HINT}"
                )
            warnings.warn(
                f"the compiled sampler kernel ({kernel.where()}) is not "
                "built: sampling with vectorised torch, ~3-4x slower and with a different "
                f"random stream. For the fast kernel, {kernel.HINT}",
                stacklevel=2,
            )
            backend = "torch"
        self.backend = "kernel" if backend == "auto" else backend
        self.csr = csr
        self.fanouts = list(fanouts)
        self.replace = replace
        self._local = torch.full((csr.num_nodes,), -1, dtype=torch.long)
        if self.backend == "torch":
            if csr.col.dtype != torch.long:  # the vectorised path indexes with int64 only
                self.csr = CSRGraph(csr.rowptr.long(), csr.col.long())
            self._first = torch.full((csr.num_nodes,), _UNSEEN, dtype=torch.long)
        else:  # the kernel reads the CSR through raw pointers: contiguous int64 only
            self._rowptr = csr.rowptr.long().contiguous()
            # int32 col (a prepared graph's indices, memory-mapped) is read in place when the
            # kernel has its int32 hop; anything else is read as int64
            self._hop = kernel.load().gnnpar_sample_hop
            if csr.col.dtype == torch.int32:
                self._col = csr.col.contiguous()
                self._hop = kernel.load().gnnpar_sample_hop32
            else:
                self._col = csr.col.long().contiguous()
            kmax = max(self.fanouts, default=1)
            table = kernel.load().gnnpar_table_size(max(kmax, 1))
            self._table = torch.empty(table, dtype=torch.long)
            self._nid = torch.empty(csr.num_nodes, dtype=torch.long)  # n_id of the batch
            self._edges = torch.empty(2, 0, dtype=torch.long)  # grown to the largest batch

    def _neighbours(
        self, nodes: torch.Tensor, fanout: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(edge positions in ``col``, index into ``nodes`` of the target) of the sampled edges."""
        start = self.csr.rowptr[nodes]
        deg = self.csr.rowptr[nodes + 1] - start
        if fanout < 0:
            take = deg
            return _ranges(start, take), torch.repeat_interleave(torch.arange(nodes.numel()), take)
        if self.replace:
            # exactly `fanout` draws per node that has any neighbour (PyG's replace=True)
            has = (deg > 0).nonzero().view(-1)
            u = torch.rand(has.numel(), fanout, generator=gen, dtype=torch.float64)
            pick = start[has, None] + _draw(u, deg[has, None])
            return pick.view(-1), has.repeat_interleave(fanout)
        small = deg <= fanout  # these keep every neighbour, no randomness needed
        idx_small = small.nonzero().view(-1)
        pos_small = _ranges(start[idx_small], deg[idx_small])
        tgt_small = torch.repeat_interleave(idx_small, deg[idx_small])
        # fanout < deg < 4 fanout: random keys over the row; deg >= 4 fanout: draws with
        # rejection of repeats, O(fanout) per row instead of O(deg) (Reddit: deg ~500, fanout 25)
        mid = (~small & (deg < 4 * fanout)).nonzero().view(-1)
        big = (deg >= 4 * fanout).nonzero().view(-1)
        pos_mid, tgt_mid = _subset_by_keys(start[mid], deg[mid], fanout, gen)
        pos_big, tgt_big = _subset_by_rejection(start[big], deg[big], fanout, gen)
        pos = torch.cat([pos_small, pos_mid, pos_big])
        return pos, torch.cat([tgt_small, mid[tgt_mid], big[tgt_big]])

    def _torch_hop(
        self, frontier: torch.Tensor, frontier_begin: int, total: int, fanout: int, gen
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One hop in vectorised torch: (local sources, local targets, new nodes)."""
        local, first = self._local, self._first
        pos, tgt = self._neighbours(frontier, fanout, gen)
        nbr = self.csr.col[pos]
        # nodes seen for the first time, each once, in order of first appearance:
        # the smallest position of each id wins (scatter amin), whatever the write order
        fresh = nbr[local[nbr] < 0]
        order = torch.arange(fresh.numel())
        first.scatter_reduce_(0, fresh, order, "amin")
        new = fresh[first[fresh] == order]
        first[fresh] = _UNSEEN
        local[new] = torch.arange(total, total + new.numel())
        return local[nbr], tgt + frontier_begin, new

    def _kernel_sample(self, seeds: torch.Tensor, gen: torch.Generator) -> SampledBatch:
        """All hops in the compiled kernel (``sampler_kernel.c``): for each frontier node,
        Floyd's algorithm (without replacement) or direct draws (with) from a splitmix64
        stream keyed by (the hop's seed, the node's id), then the node-mark relabelling in one
        pass over the sampled edges. One 63-bit seed per hop comes from ``gen``, so the same
        generator seed gives the same batch.

        The kernel writes straight into two buffers the sampler keeps (edges, node ids), so a
        batch costs one copy of each out of them and no per-hop concatenation."""
        local, nid = self._local, self._nid
        k = seeds.numel()
        nid[:k] = seeds
        local[seeds] = torch.arange(k)
        total, frontier_begin, e_total = k, 0, 0
        num_nodes, num_edges = [k], []
        n_new = ctypes.c_int64(0)
        try:
            for fanout in self.fanouts:
                n = total - frontier_begin
                frontier = nid[frontier_begin:total]
                if fanout < 0:
                    deg = self._rowptr[frontier + 1] - self._rowptr[frontier]
                    cap = int(deg.sum()) if n else 0
                else:
                    cap = n * fanout
                if e_total + cap > self._edges.size(1):
                    grown = torch.empty(
                        2, max(2 * self._edges.size(1), e_total + cap), dtype=torch.long
                    )
                    grown[:, :e_total] = self._edges[:, :e_total]
                    self._edges = grown
                edges, stride = self._edges, self._edges.stride(0) * 8
                seed = int(torch.empty((), dtype=torch.long).random_(generator=gen))
                e = self._hop(
                    self._rowptr.data_ptr(),
                    self._col.data_ptr(),
                    frontier.data_ptr(),
                    None,  # keys: the node ids are the original ids
                    n,
                    frontier_begin,
                    fanout,
                    int(self.replace),
                    seed,
                    local.data_ptr(),
                    total,
                    edges.data_ptr() + 8 * e_total,
                    edges.data_ptr() + stride + 8 * e_total,
                    nid.data_ptr() + 8 * total,
                    ctypes.byref(n_new),
                    self._table.data_ptr(),
                )
                num_nodes.append(n_new.value)
                num_edges.append(e)
                frontier_begin, total, e_total = total, total + n_new.value, e_total + e
        finally:
            local[nid[:total]] = -1  # leave the mark array clean for the next batch
        return SampledBatch(
            nid[:total].clone(), self._edges[:, :e_total].clone(), k, num_nodes, num_edges
        )

    def sample(self, seeds: torch.Tensor, gen: torch.Generator) -> SampledBatch:
        """Sample the ``len(fanouts)``-hop neighbourhood of ``seeds`` (distinct global node ids)."""
        seeds = seeds.long()
        if self.backend == "kernel":
            return self._kernel_sample(seeds, gen)
        local = self._local
        n_ids = [seeds]
        local[seeds] = torch.arange(seeds.numel())
        total = seeds.numel()
        frontier, frontier_begin = seeds, 0
        rows, cols = [], []
        num_nodes, num_edges = [seeds.numel()], []
        try:
            for fanout in self.fanouts:
                row, col, new = self._torch_hop(frontier, frontier_begin, total, fanout, gen)
                rows.append(row)
                cols.append(col)
                n_ids.append(new)
                num_nodes.append(new.numel())
                num_edges.append(row.numel())
                frontier, frontier_begin = new, total
                total += new.numel()
        finally:
            n_id = torch.cat(n_ids)
            local[n_id] = -1  # leave the mark array clean for the next batch
        if rows:
            edge_index = torch.stack([torch.cat(rows), torch.cat(cols)])
        else:  # no hops (fanouts == [])
            edge_index = torch.empty(2, 0, dtype=torch.long)
        return SampledBatch(n_id, edge_index, seeds.numel(), num_nodes, num_edges)
