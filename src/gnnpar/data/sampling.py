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
(BENCHMARKS.md, ``benchmarks/peers.py``). A C library rather than a
torch C++ extension: no torch headers, so it builds in a second and fits any torch build
(CPU or CUDA); rather than numba: no extra dependency and no JIT compile in every loader
worker. The vectorised-torch version below stays as the fallback when the kernel is not built;
it draws a different random stream.

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
kernel draws one 63-bit seed per hop from it), so the same seed gives the same batches.

Relabelling uses node-mark arrays of size ``num_nodes`` owned by the sampler (reset after each
batch, touching only the nodes it marked) instead of ``torch.unique`` over the sampled ids: a
scatter plus a gather is O(sampled) and keeps nodes in order of first appearance.

    from gnnpar.data.sampling import CSRGraph, NeighborSampler
    csr = CSRGraph.from_edge_index(data.edge_index, data.num_nodes)
    batch = NeighborSampler(csr, [25, 10, 10]).sample(seeds, torch.Generator().manual_seed(0))
    out = model(data.x[batch.n_id], batch.edge_index)[: batch.batch_size]
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import multiprocessing as mp
import os
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from gnnpar import UsageError
from gnnpar.csr import indptr

_UNSEEN = torch.iinfo(torch.long).max


@dataclass
class CSRGraph:
    """Incoming adjacency: the in-neighbours of node ``v`` are ``col[rowptr[v]:rowptr[v + 1]]``."""

    rowptr: torch.Tensor  # [N + 1] int64
    col: torch.Tensor  # [E] int64, source node of each edge, grouped by target node

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


_KERNEL_VERSION = 1  # must equal GNNPAR_KERNEL_VERSION in sampler_kernel.c
_KERNEL_DIR = Path(__file__).parent
_KERNEL_STEM = "_sampler_kernel"
_KERNEL_HINT = (
    "install a C compiler (gcc) and reinstall gnnpar (from its source: pip install "
    "--force-reinstall --no-deps .), or in a checkout run scripts/setup.sh (make setup)"
)
_kernel_lib: ctypes.CDLL | None = None
_kernel_file: Path | None = None
_kernel_tried = False


def _kernel_candidates() -> list[Path]:
    """Where the compiled kernel may lie, in order of preference: the names setuptools gives the
    library it builds from ``sampler_kernel.c`` (``_sampler_kernel`` plus an extension-module
    suffix such as ``.cpython-311-x86_64-linux-gnu.so``), then the plain ``_sampler_kernel.so``
    that older versions of scripts/setup.sh built."""
    suffixes = list(importlib.machinery.EXTENSION_SUFFIXES)
    if ".so" not in suffixes:
        suffixes.append(".so")
    return [_KERNEL_DIR / f"{_KERNEL_STEM}{s}" for s in suffixes]


def kernel_available() -> bool:
    """Whether the compiled hop kernel (built from ``sampler_kernel.c`` by ``pip install``, a
    wheel build or scripts/setup.sh) is present and of the version this module expects."""
    return _kernel() is not None


def kernel_path() -> Path | None:
    """The file the compiled hop kernel was loaded from (None: not available)."""
    return _kernel_file if _kernel() is not None else None


def _kernel() -> ctypes.CDLL | None:
    global _kernel_lib, _kernel_file, _kernel_tried
    if not _kernel_tried:  # once per process (a loader worker loads it for itself)
        _kernel_tried = True
        for path in _kernel_candidates():
            if not path.is_file():
                continue
            try:
                lib = ctypes.CDLL(str(path))
                lib.gnnpar_kernel_version.restype = ctypes.c_int64
                if lib.gnnpar_kernel_version() != _KERNEL_VERSION:
                    continue  # a stale build: perhaps a later candidate is current
                i64, ptr = ctypes.c_int64, ctypes.c_void_p
                lib.gnnpar_sample_hop.restype = i64
                lib.gnnpar_sample_hop.argtypes = [ptr, ptr, ptr, i64, i64, i64, i64]
                lib.gnnpar_sample_hop.argtypes += [ctypes.c_uint64, ptr, i64, ptr, ptr, ptr]
                lib.gnnpar_sample_hop.argtypes += [ptr, ptr]
                lib.gnnpar_table_size.restype = i64
                lib.gnnpar_table_size.argtypes = [i64]
            except (OSError, AttributeError):  # not loadable here, or not the kernel
                continue
            _kernel_lib, _kernel_file = lib, path
            break
    return _kernel_lib


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
        if backend != "torch" and _kernel() is None:
            if backend == "kernel":
                raise UsageError(
                    f"the compiled sampler kernel ({_KERNEL_STEM}*.so in {_KERNEL_DIR}) is "
                    f"missing or out of date: {_KERNEL_HINT}"
                )
            warnings.warn(
                f"the compiled sampler kernel ({_KERNEL_STEM}*.so in {_KERNEL_DIR}) is not "
                "built: sampling with vectorised torch, ~3-4x slower and with a different "
                f"random stream. For the fast kernel, {_KERNEL_HINT}",
                stacklevel=2,
            )
            backend = "torch"
        self.backend = "kernel" if backend == "auto" else backend
        self.csr = csr
        self.fanouts = list(fanouts)
        self.replace = replace
        self._local = torch.full((csr.num_nodes,), -1, dtype=torch.long)
        if self.backend == "torch":
            self._first = torch.full((csr.num_nodes,), _UNSEEN, dtype=torch.long)
        else:  # the kernel reads the CSR through raw pointers: contiguous int64 only
            self._rowptr = csr.rowptr.long().contiguous()
            self._col = csr.col.long().contiguous()
            kmax = max(self.fanouts, default=1)
            self._table = torch.empty(_kernel().gnnpar_table_size(max(kmax, 1)), dtype=torch.long)
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
        stream, then the node-mark relabelling in one pass over the sampled edges. One 63-bit
        seed per hop comes from ``gen``, so the same generator seed gives the same batch.

        The kernel writes straight into two buffers the sampler keeps (edges, node ids), so a
        batch costs one copy of each out of them and no per-hop concatenation."""
        lib, local, nid = _kernel_lib, self._local, self._nid
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
                e = lib.gnnpar_sample_hop(
                    self._rowptr.data_ptr(),
                    self._col.data_ptr(),
                    frontier.data_ptr(),
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


def reference_sample(
    csr: CSRGraph, seeds: torch.Tensor, fanouts: list[int], gen: torch.Generator
) -> SampledBatch:
    """A straightforward per-node sampler (Python loop, one ``randperm`` per node, a dict for
    relabelling) without replacement: the baseline of ``benchmarks/sampler_throughput.py`` and an
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


# ------------------------------------------------------------------- sharding and the DataLoader
def shard_plan(num_train: int, world_size: int, batch_size: int) -> tuple[int, int]:
    """(seed nodes per rank, steps per epoch): the same on every rank, so DDP never waits on a
    rank that has run out of batches.

    Each epoch the training nodes are shuffled and cut into ``world_size`` equal blocks of
    ``num_train // world_size`` nodes; the ``num_train % world_size`` (< world_size) nodes left at
    the end of that epoch's shuffle are dropped for that epoch only (a different few each epoch).
    A rank's block is cut into batches of ``batch_size``; the last one may be smaller, and it is
    the same size on every rank.
    """
    if world_size < 1 or batch_size < 1:
        raise ValueError(f"world_size and batch_size must be >= 1, got {world_size}, {batch_size}")
    per_rank = num_train // world_size
    return per_rank, -(-per_rank // batch_size)


def epoch_seeds(
    train_idx: torch.Tensor, seed: int, epoch: int, rank: int, world_size: int, batch_size: int
) -> list[torch.Tensor]:
    """This rank's seed batches for ``epoch``: one shuffle shared by all ranks (same generator
    seed), then this rank's block of it (see :func:`shard_plan`)."""
    per_rank, steps = shard_plan(train_idx.numel(), world_size, batch_size)
    gen = torch.Generator().manual_seed(_mix(seed, epoch))
    perm = train_idx[torch.randperm(train_idx.numel(), generator=gen)]
    block = perm[rank * per_rank : (rank + 1) * per_rank]
    return [block[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


def _mix(*parts: int) -> int:
    """A deterministic 63-bit seed from several integers (Python's hash of ints is not mixed)."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & 0x7FFFFFFFFFFFFFFF


def save_shared_graph(path: str, csr: CSRGraph, x: torch.Tensor, y: torch.Tensor) -> None:
    """Write the tensors a sampler process needs to one file that every process then maps.

    Format: ``torch.save`` of ``{"rowptr", "col", "x", "y"}``; read with
    ``torch.load(path, mmap=True)`` so the pages are shared by every rank and loader worker of
    the machine (one copy; ``/dev/shm`` keeps it in memory). Written to ``path + ".tmp"`` and
    renamed, so a reader never sees half a file.
    """
    tmp = f"{path}.tmp"
    torch.save({"rowptr": csr.rowptr, "col": csr.col, "x": x, "y": y}, tmp)
    os.replace(tmp, path)


class SampledBatches(torch.utils.data.Dataset):
    """Mini-batch ``i`` of a run: epoch ``i // steps``, step ``i % steps`` of this rank.

    What crosses into a loader worker when it starts is only this small object: the graph file's
    path and this rank's plan. Each process maps the graph itself on first use
    (:meth:`_graph`), so ``spawn``/``forkserver`` workers neither copy the graph nor inherit
    anything of the parent (threads, process group). The random numbers of batch ``i`` come from
    a generator seeded with ``(seed, epoch, rank, step)``, so a batch is the same whichever worker
    (or the main process) makes it, and the same for any ``--loader-workers``.
    """

    def __init__(
        self,
        graph_path: str,
        train_idx: torch.Tensor,
        fanouts: list[int],
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        steps: int,
        replace: bool = False,
    ) -> None:
        self.graph_path = graph_path
        self.train_idx = train_idx
        self.fanouts = fanouts
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.steps = steps
        self.replace = replace
        self.owner_pid = os.getpid()  # the training process; workers end when it is gone
        self._state: dict | None = None  # mapped graph + sampler, per process
        self._epoch: tuple[int, list[torch.Tensor]] | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_state"] = None  # never pickle the graph or the mark arrays to a worker
        state["_epoch"] = None
        return state

    def _graph(self) -> dict:
        if self._state is None:
            g = torch.load(self.graph_path, mmap=True, weights_only=True)
            csr = CSRGraph(g["rowptr"], g["col"])
            g["sampler"] = NeighborSampler(csr, self.fanouts, self.replace)
            self._state = g
        return self._state

    def __getitem__(self, i: int) -> SampledBatch:
        epoch, step = divmod(int(i), self.steps)
        if self._epoch is None or self._epoch[0] != epoch:
            seeds = epoch_seeds(
                self.train_idx, self.seed, epoch, self.rank, self.world_size, self.batch_size
            )
            self._epoch = (epoch, seeds)
        seeds = self._epoch[1][step]
        g = self._graph()
        gen = torch.Generator().manual_seed(_mix(self.seed, epoch, self.rank, step))
        b: SampledBatch = g["sampler"].sample(seeds, gen)
        b.x, b.y = g["x"][b.n_id], g["y"][seeds]
        return b


def _worker_init(worker_id: int) -> None:
    # One thread per sampler process: W workers x R ranks on C cores must not each start C
    # OpenMP threads (oversubscription turns into minutes-long stalls that look like hangs).
    torch.set_num_threads(1)
    owner = torch.utils.data.get_worker_info().dataset.owner_pid
    threading.Thread(target=_exit_with_owner, args=(owner,), daemon=True).start()


def _exit_with_owner(pid: int, every_s: float = 1.0) -> None:
    """End this worker when the training process ``pid`` is gone.

    A forkserver worker is a child of the fork server, not of the rank, so DataLoader's own
    watchdog (is my parent alive?) does not fire when the rank is killed; and the fork server
    lives as long as its children hold its pipe. Without this, a killed rank leaves its workers
    and fork server behind for good.
    """
    while True:
        time.sleep(every_s)
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            alive = state not in ("Z", "X")  # a zombie has exited; its parent just has not reaped
        except FileNotFoundError:
            alive = False
        except OSError:  # no /proc: fall back on signal 0
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
        if not alive:
            os._exit(0)


def build_loader(
    dataset: SampledBatches,
    epochs: int,
    workers: int,
    timeout_s: float,
    start_method: str = "forkserver",
    start: int = 0,
) -> torch.utils.data.DataLoader:
    """A DataLoader over batches ``0 .. epochs * steps - 1`` of ``dataset`` with ``workers``
    persistent worker processes (0: sample in the training process). One pass covers the whole
    run, so workers keep prefetching across epoch boundaries instead of idling while a new
    epoch's iterator is set up. See :mod:`gnnpar.strategies.sampled` for why ``forkserver``.
    As with ``spawn``, workers import the main module: a script that trains with loader workers
    needs the usual ``if __name__ == "__main__":`` guard (``python -m gnnpar`` has it)."""
    # batch i = epoch i // steps, step i % steps; a resumed run starts at its checkpoint's batch
    order = range(start, epochs * dataset.steps)
    if workers == 0:
        return torch.utils.data.DataLoader(dataset, batch_size=None, sampler=order)
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # the fork server imports these once; each worker is then a cheap fork of a process
        # that has no threads, no OpenMP pool and no process group
        ctx.set_forkserver_preload(["torch", __name__])
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        sampler=order,
        num_workers=workers,
        persistent_workers=True,
        multiprocessing_context=ctx,
        worker_init_fn=_worker_init,
        timeout=timeout_s,  # a stuck or dead worker ends in an error, not a hang
        prefetch_factor=2,
    )
    return loader
