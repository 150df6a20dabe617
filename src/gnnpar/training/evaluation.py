"""Evaluation: exact full-graph inference in bounded memory, and image scoring.

Every strategy scores its final model here (graphs: :func:`evaluate_graph`, the whole graph,
never its partitions; images: :func:`evaluate_images`). Choosing a final model scores several
models on one graph: an :class:`EvalGraphCache` passed along keeps the sparse adjacency built
for the first one.
"""

from __future__ import annotations

import mmap
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import GCNConv, MessagePassing
from torch_geometric.utils import remove_self_loops

from gnnpar.csr import indptr
from gnnpar.data.types import GraphDataset, ImageDataset
from gnnpar.runtime import resources
from gnnpar.training.metrics import score
from gnnpar.training.sources import image_batches

# Full-graph inference materialises one message per edge and feature (E x width floats): at
# synthetic-reddit size (115 M edges x 128) that is ~60 GB. Above this many bytes of messages,
# graph_logits takes an exact path that never holds them (see there).
MESSAGE_BYTES_LIMIT = 1 << 30


class EvalGraphCache:
    """The sparse adjacency :func:`graph_logits` built last, to score several models on one graph.

    On a large graph, building the CSR adjacency of full-graph inference is the peak of an
    evaluation (synthetic-reddit, 115 M edges: ~4.9 GiB while it is built, ~1.4 GiB kept);
    choosing a final model scores every rank's model and their average on one rank, so the
    adjacency is built once for all of them and freed with the cache.
    """

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.adj_t: torch.Tensor | None = None


@torch.no_grad()
def graph_logits(
    model: nn.Module,
    x: torch.Tensor,
    edge_index: torch.Tensor,
    limit: int | None = None,
    cache: EvalGraphCache | None = None,
    targets: torch.Tensor | None = None,
    budget: int | None = None,
    spill_dir: str | os.PathLike | None = None,
) -> torch.Tensor:
    """The model's output for every node of a whole graph (or, where ``targets`` is given, for
    those nodes, in their order: the rows of the result), exact, in bounded memory.
    ``edge_index``: the graph's [2, E] tensor, or its in-edge CSR as an :class:`InEdges` (a
    prepared folder's, mapped: read a block of rows at a time, never rebuilt whole; its
    half-precision features ``x`` are widened where read), with the same results.

    Small graphs: one plain forward pass. Large graphs, chosen because every node must be
    scored exactly as full-graph inference would (scoring on the Cluster-GCN subgraphs would drop
    the edges between parts, and change the scores with the partitioning):

    * if every convolution fuses message passing into a sparse product (``GCNConv``,
      ``SAGEConv``), the model runs once on a sparse CSR adjacency: memory is O(E) indices plus
      O(N x width) activations, never O(E x width);
    * otherwise (``GATConv``: one attention weight per edge), layer-wise and node-chunked: each
      block runs on chunks of destination nodes together with their in-neighbours, holding
      about ``limit`` bytes of messages at a time (at most a tenth of ``budget``). Exact because such a block's output at a node
      depends only on its own features and its incoming edges (attention is normalised over
      them).

    Both large-graph paths run layer by layer (GCN's sparse product apart: one pass of the
    whole model) and score only ``targets`` at the last layer. A layer's hidden states (N x
    width floats, 2.2 GB per layer for synthetic-papers100m at scale 0.02 and width 256) are
    kept in memory while the two of them (a layer's input and output) fit in half of
    ``budget`` (bytes; default the memory the run may use,
    :func:`gnnpar.runtime.footprint.available_bytes`: a cgroup's limit where there is one),
    else in a disk-backed array (numpy memmap) in a temporary folder in ``spill_dir`` (default
    ``$GNNPAR_SPILL_DIR``, else the system's temporary folder), removed when done. The scores
    are the same bit for bit on either side (tests/training/test_evaluation_memory.py).

    Runs in the caller's precision (the loop's autocast under ``--precision bf16``; ``gnnpar
    predict`` enters the same) and returns fp32 logits. The sparse product path runs in fp32
    even then: CPU has no bfloat16 CSR product, and fp32 there is exact on every device.

    Why one function: the choice among the exact ways above and each way's short body; apart,
    each would take the same model, graph, targets and memory budget.
    """
    limit = MESSAGE_BYTES_LIMIT if limit is None else limit
    edges = edge_index if isinstance(edge_index, InEdges) else None
    if x.dtype in (torch.float16, torch.bfloat16) and not (edges and _rowwise(model)):
        x = x.float()  # half-precision features: only the row path widens them row by row
    convs = [m for m in model.modules() if isinstance(m, MessagePassing)]
    # Widest feature a message can carry (SAGEConv aggregates its input before projecting).
    width = max((max(p.shape) for p in model.parameters() if p.dim() == 2), default=1)
    if budget is None:
        from gnnpar.runtime.footprint import available_bytes

        budget = available_bytes(torch.device("cpu"))
    if budget is not None:
        # a block's messages, its gathered rows and the aggregation's copies take ~3x ``limit``
        # at their peak (measured: 3.2 GB for 1 GiB): a tenth of the budget leaves the rest to
        # the hidden states (half of it) and to the process itself
        limit = min(limit, max(1 << 20, budget // 10))
    num_edges = edges.num_edges if edges is not None else edge_index.size(1)
    if num_edges * width * 4 <= limit or not convs:
        if edges is not None:
            x, edge_index = x.float(), edges.edge_index()
        out = model(x, edge_index).float()
        return out if targets is None else out[targets]
    n = x.size(0)
    rows = _rowwise(model)
    store = HiddenStore(budget, spill_dir)
    fused = all(
        type(c).message_and_aggregate is not MessagePassing.message_and_aggregate for c in convs
    )
    if fused:
        gcn = all(isinstance(c, GCNConv) for c in convs)
        # the caller's graph (before any edit below) identifies the adjacency for the cache
        if edges is not None:
            cache_key = (edges.key, n, gcn)
        else:
            cache_key = (edge_index.data_ptr(), edge_index.size(1), edge_index._version, n, gcn)
        if cache is not None and cache.key == cache_key:
            return _fused(model, x, cache.adj_t, targets, rows, store)
        if rows and not gcn and (edges is not None or not store.adjacency_fits(num_edges)):
            # the whole adjacency is not built where it need not be (an in-edge CSR: each
            # block of rows is read from it) or does not fit beside the hidden states (each
            # block of rows builds its own from a pass over the edges): the same rows, so
            # the same sums
            blocks = (
                CSRRows(edges, x.dtype if x.dtype == torch.float32 else torch.float32)
                if edges is not None
                else StreamedRows(edge_index, n, x.dtype)
            )
            if blocks.unique_edges() == num_edges:
                with store, torch.autocast(x.device.type, enabled=False):
                    return _layerwise_rows(model, x, blocks, targets, store).float()
            x = x.float()
        if edges is not None:
            crow, col, counts = edges.adjacency(drop_self_loops=gcn)
        else:
            if gcn:
                # GCNConv adds self-loops to a sparse adjacency unconditionally but only the
                # missing ones to an edge_index; dropping existing ones first makes the two agree.
                edge_index, _ = remove_self_loops(edge_index)
            key, counts = torch.unique(edge_index[1] * n + edge_index[0], return_counts=True)
            crow, col = indptr(key // n, n), key % n
            del key
        # Duplicate edges become one entry holding their multiplicity: exact for GCN's weighted
        # sums, but a mean (SAGEConv) would count them once, so it takes the chunked path.
        if gcn or col.numel() == num_edges:
            with warnings.catch_warnings():  # "sparse CSR support is in beta": nothing to act on
                warnings.simplefilter("ignore", UserWarning)
                adj_t = torch.sparse_csr_tensor(crow, col, counts.to(x.dtype), (n, n))
            del crow, col, counts
            if cache is not None:
                cache.key, cache.adj_t = cache_key, adj_t
            return _fused(model, x, adj_t, targets, rows, store)  # row = destination (PyG's)
        del crow, col, counts
    x = x.float()
    with store:
        return _layerwise_chunked(
            model,
            x,
            edges if edges is not None else InEdges.from_edge_index(edge_index, n),
            max(1, limit // (width * 4)),
            targets,
            store,
        ).float()


def _fused(
    model: nn.Module,
    x: torch.Tensor,
    adj_t: torch.Tensor,
    targets: torch.Tensor | None,
    rows: bool,
    store: HiddenStore,
) -> torch.Tensor:
    """The sparse-product path: layer by layer on row blocks of ``adj_t`` where every block
    takes a bipartite input (:func:`_rowwise`), else the whole model at once."""
    if not rows:
        out = _fp32(model, x, adj_t)
        return out if targets is None else out[targets]
    with store, torch.autocast(x.device.type, enabled=False):
        return _layerwise_rows(model, x, SlicedRows(adj_t), targets, store).float()


def _fp32(model: nn.Module, x: torch.Tensor, adj_t: torch.Tensor) -> torch.Tensor:
    """``model(x, adj_t)`` without autocast: a bfloat16 CSR product is not implemented on CPU."""
    with torch.autocast(x.device.type, enabled=False):
        return model(x, adj_t)


def _layerwise_chunked(
    model: nn.Module,
    x: torch.Tensor,
    edges: InEdges,
    edges_per_chunk: int,
    targets: torch.Tensor | None = None,
    store: HiddenStore | None = None,
) -> torch.Tensor:
    """Each block on chunks of destination nodes with their in-neighbours (a local graph), the
    chunks' outputs written into the layer's hidden states (``store``: in memory or on disk);
    the last block for ``targets`` only (every node where None), in their order, and each block
    before it only for the nodes the next one reads (:func:`_closures`). A chunk's edges are
    read from ``edges`` (an in-memory sort of the graph's edge_index, or a prepared folder's
    mapped CSR: the same rows in the same order)."""
    n = x.size(0)
    store = store if store is not None else HiddenStore(None, None, in_memory=True)
    ptr = edges.ptr
    h, pos = model.stem(x), None
    last = len(model.blocks) - 1
    outs = _closures(edges.neighbours, targets, n, last + 1)
    for i, block in enumerate(model.blocks):
        dests = outs[i]
        out = None
        for at, dst_ids in _chunks(ptr, dests, n, edges_per_chunk):
            src, deg = edges.sources(dst_ids)
            dst = torch.repeat_interleave(dst_ids, deg, output_size=src.numel())
            nodes = torch.unique(torch.cat([dst_ids, src]))  # sorted
            local = torch.stack([torch.searchsorted(nodes, src), torch.searchsorted(nodes, dst)])
            o = block(_read(h, pos, nodes), local)[torch.searchsorted(nodes, dst_ids)]
            if out is None:
                rows = n if dests is None else dests.numel()
                out = store.layer(rows, o.size(1), o.dtype, in_memory=i == last)
            out[at : at + o.size(0)] = o
        h, pos = store.advance(out), _positions(dests, n)
    return model.head(h)


def _layerwise_rows(
    model: nn.Module,
    x: torch.Tensor,
    adjacency: SlicedRows | StreamedRows,
    targets: torch.Tensor | None,
    store: HiddenStore,
) -> torch.Tensor:
    """Each block ``block((h, h[rows]), adjacency rows)`` on blocks of destination rows (the
    same sums, row by row, as the whole model on the whole adjacency); the last block for
    ``targets`` only, and each block before it only for the nodes the next one reads
    (:func:`_closures`).

    Where ``h`` is all of the layer's rows in memory, each block reads them in place, as the
    whole model would. Otherwise (a spilled layer, or one holding only a closure's rows) a
    block reads the rows its adjacency names once each, in ascending order, in one batch, and
    its columns are renumbered to them: the same values in the same order in every row's sum,
    so the same outputs, bit for bit. So are half-precision features (a prepared folder's,
    mapped): read so, a block's rows at a time, and widened to float32 (exact), never whole."""
    n = x.size(0)
    h, pos = model.stem(x), None
    last = len(model.blocks) - 1
    outs = _closures(adjacency.neighbours, targets, n, last + 1)
    for i, block in enumerate(model.blocks):
        dests = outs[i]
        out = None
        in_place = pos is None and not store.on_disk and h.dtype == torch.float32
        for at, dst_ids in _chunks(adjacency.ptr, dests, n, ROW_CHUNK_EDGES):
            adj = adjacency.rows(dst_ids)
            if in_place:
                o = block((h, h[dst_ids]), adj)
            else:
                cols, inv = torch.unique(adj.col_indices(), return_inverse=True)
                shape = (dst_ids.numel(), cols.numel())
                local = _csr(adj.crow_indices(), inv, adj.values(), shape)
                # (.float(): this path runs in fp32; it widens half-precision features)
                o = block((_read(h, pos, cols).float(), _read(h, pos, dst_ids).float()), local)
            if out is None:
                rows = n if dests is None else dests.numel()
                out = store.layer(rows, o.size(1), o.dtype, in_memory=i == last)
            out[at : at + o.size(0)] = o
        h, pos = store.advance(out), _positions(dests, n)
    return model.head(h)


def _closures(
    neighbours, targets: torch.Tensor | None, n: int, layers: int
) -> list[torch.Tensor | None]:
    """The nodes each block computes: the last, ``targets``; each one before, the nodes the next
    reads (S_{l-1} = S_l plus their in-neighbours), sorted; None for every node (no targets, or
    a closure that has grown to the whole graph, and every block before it).
    ``neighbours(ids, into)`` sets ``into[v]`` for the in-neighbours v of ``ids``."""
    outs: list[torch.Tensor | None] = [None] * layers
    if targets is None:
        return outs
    outs[-1] = cur = targets
    for i in range(layers - 2, -1, -1):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[cur] = True
        neighbours(cur, mask)
        cur = mask.nonzero().flatten()
        del mask
        if cur.numel() == n:
            break
        outs[i] = cur
    return outs


def _positions(ids: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """Where each node's row is in a layer holding the rows of ``ids`` (-1: not held); None for
    a layer holding every node's row at its id."""
    if ids is None:
        return None
    dtype = torch.int32 if ids.numel() < 2**31 else torch.long
    pos = torch.full((n,), -1, dtype=dtype)
    pos[ids] = torch.arange(ids.numel(), dtype=dtype)
    return pos


def _read(h: torch.Tensor, pos: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
    """The rows of nodes ``ids`` (ascending, distinct: one batched read in file order where
    ``h`` is a spilled layer) of a layer whose rows are at ``pos`` (None: at the node ids)."""
    return h[ids] if pos is None else h[pos[ids].long()]


def _csr(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, shape) -> torch.Tensor:
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, val, shape, check_invariants=False)


class SlicedRows:
    """Blocks of rows of a whole CSR adjacency (destination rows, source columns)."""

    def __init__(self, adj_t: torch.Tensor) -> None:
        self.adj_t = adj_t
        self.ptr = adj_t.crow_indices()

    def rows(self, dst_ids: torch.Tensor) -> torch.Tensor:
        crow, col, val = self.ptr, self.adj_t.col_indices(), self.adj_t.values()
        sel = _ranges(crow[dst_ids], crow[dst_ids + 1])
        sub_crow = torch.zeros(dst_ids.numel() + 1, dtype=crow.dtype)
        torch.cumsum(crow[dst_ids + 1] - crow[dst_ids], 0, out=sub_crow[1:])
        return _csr(sub_crow, col[sel], val[sel], (dst_ids.numel(), self.adj_t.size(1)))

    def neighbours(self, ids: torch.Tensor, into: torch.Tensor) -> None:
        """Set ``into[v]`` for every in-neighbour v of the nodes ``ids``."""
        into[self.adj_t.col_indices()[_ranges(self.ptr[ids], self.ptr[ids + 1])]] = True


class StreamedRows:
    """Blocks of rows of the adjacency of ``edge_index``, each built from one pass over the
    edges when asked for, never the whole: O(N) integers (the in-degrees) plus one block's
    edges, instead of the whole adjacency and its sort (~1.5 GB for 32M edges). A block's
    rows are those the whole adjacency would have (columns ascending, a repeated edge one
    entry holding its count), so the products are the same, bit for bit."""

    def __init__(self, edge_index: torch.Tensor, n: int, dtype: torch.dtype) -> None:
        self.edge_index, self.n, self.dtype = edge_index, n, dtype
        # in-degrees: where the blocks of about ROW_CHUNK_EDGES edges cut (repeats counted)
        self.ptr = torch.zeros(n + 1, dtype=torch.long)
        torch.cumsum(torch.bincount(edge_index[1], minlength=n), 0, out=self.ptr[1:])

    def _block(self, dst_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sorted unique keys ``row * n + source`` of the edges into ``dst_ids`` (row: the
        position in ``dst_ids``), and their counts."""
        m = dst_ids.numel()
        lo, hi = (int(dst_ids[0]), int(dst_ids[-1]) + 1) if m else (0, 0)
        pos = None
        if hi - lo != m:  # not a range of rows (the targets of the last layer): a lookup
            pos = torch.full((self.n,), -1, dtype=torch.int32)
            pos[dst_ids] = torch.arange(m, dtype=torch.int32)
        keys = []
        for a in range(0, self.edge_index.size(1), EDGE_SCAN):  # a slice of edges at a time
            dst, src = self.edge_index[1, a : a + EDGE_SCAN], self.edge_index[0, a : a + EDGE_SCAN]
            if pos is None:
                hit = ((dst >= lo) & (dst < hi)).nonzero().flatten()
                row = dst[hit] - lo
            else:
                row = pos[dst]
                hit = (row >= 0).nonzero().flatten()
                row = row[hit].long()
            keys.append(row * self.n + src[hit])
        return torch.unique(torch.cat(keys), return_counts=True)

    def neighbours(self, ids: torch.Tensor, into: torch.Tensor) -> None:
        """Set ``into[v]`` for every in-neighbour v of the nodes ``ids`` (one pass)."""
        wanted = torch.zeros(self.n, dtype=torch.bool)
        wanted[ids] = True
        for a in range(0, self.edge_index.size(1), EDGE_SCAN):
            dst, src = self.edge_index[1, a : a + EDGE_SCAN], self.edge_index[0, a : a + EDGE_SCAN]
            into[src[wanted[dst]]] = True

    def unique_edges(self) -> int:
        """The number of distinct edges (one pass, block by block)."""
        return sum(
            int(self._block(ids)[0].numel())
            for _, ids in _chunks(self.ptr, None, self.n, 8 * ROW_CHUNK_EDGES)
        )

    def rows(self, dst_ids: torch.Tensor) -> torch.Tensor:
        key, counts = self._block(dst_ids)
        m = dst_ids.numel()
        crow = indptr(key // self.n, m)
        return _csr(crow, key % self.n, counts.to(self.dtype), (m, self.n))


class InEdges:
    """A graph's in-edge CSR: the sources of node v's incoming edges are
    ``indices[ptr[v]:ptr[v + 1]]``, in the order a stable sort of its edge_index by target
    gives. A prepared folder's ``indptr`` and ``indices`` are exactly that
    (:mod:`gnnpar.data.prepared`): evaluation reads them where they are mapped, a block of rows
    at a time, instead of rebuilding the [2, E] int64 edge_index (16 bytes an edge: 2.6 GB for
    synthetic-papers100m at scale 0.1) and sorting it. ``whole`` rebuilds that edge_index, in
    its column order, for the one path that runs the model on the whole graph (a small one);
    ``key`` names the graph for :class:`EvalGraphCache`."""

    def __init__(self, ptr: torch.Tensor, indices: torch.Tensor, whole, key: Any) -> None:
        self.ptr, self.indices, self.whole, self.key = ptr, indices, whole, key
        self.n = ptr.numel() - 1
        self.num_edges = int(ptr[-1])

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, n: int) -> InEdges:
        dst_sorted, order = torch.sort(edge_index[1], stable=True)
        ptr = indptr(dst_sorted, n)
        del dst_sorted
        key = (edge_index.data_ptr(), edge_index.size(1), edge_index._version)
        return cls(ptr, edge_index[0][order], lambda: edge_index, key)

    @classmethod
    def from_prepared(cls, prepared) -> InEdges:  # noqa: ANN001 (gnnpar.data.prepared.Prepared)
        """A prepared folder's CSR, mapped (nothing read until a block asks)."""
        key = ("prepared", str(prepared.folder), prepared.manifest["arrays"]["indices"]["sha256"])
        return cls(prepared.tensor("indptr"), prepared.tensor("indices"), prepared.edge_index, key)

    def edge_index(self) -> torch.Tensor:
        return self.whole()

    def sources(self, dst_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sources of the edges into ``dst_ids`` (row by row, int64) and each row's count;
        one slice of the file where the rows are consecutive."""
        starts, ends = self.ptr[dst_ids], self.ptr[dst_ids + 1]
        m = dst_ids.numel()
        if m and int(dst_ids[-1]) - int(dst_ids[0]) + 1 == m:
            src = self.indices[int(starts[0]) : int(ends[-1])]
        else:
            src = self.indices[_ranges(starts, ends)]
        return src.long(), ends - starts

    def neighbours(self, ids: torch.Tensor, into: torch.Tensor) -> None:
        """Set ``into[v]`` for every in-neighbour v of the nodes ``ids``, about EDGE_SCAN
        edges at a time."""
        for _, part in _chunks(self.ptr, ids, self.n, EDGE_SCAN):
            into[self.sources(part)[0]] = True

    def adjacency(self, drop_self_loops: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The whole sparse adjacency (CSR rows, columns, counts) as graph_logits builds it from
        an edge_index: columns ascending, a repeated edge one entry holding its count; built a
        block of rows at a time, never sorting the whole edge list (12 bytes an edge kept)."""
        col = torch.empty(self.num_edges, dtype=torch.long)
        counts = torch.empty(self.num_edges, dtype=torch.long)
        crow = torch.zeros(self.n + 1, dtype=torch.long)
        at = 0
        for _, ids in _chunks(self.ptr, None, self.n, 8 * ROW_CHUNK_EDGES):
            key, c = _row_keys(self, ids)
            row = key // self.n
            if drop_self_loops:
                keep = (key % self.n) != ids[row]
                key, c, row = key[keep], c[keep], row[keep]
            k = key.numel()
            col[at : at + k], counts[at : at + k] = key % self.n, c
            crow[int(ids[0]) + 1 : int(ids[-1]) + 2] = torch.bincount(row, minlength=ids.numel())
            at += k
        torch.cumsum(crow, 0, out=crow)
        return crow, col[:at], counts[:at]


def _row_keys(edges: InEdges, dst_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sorted unique keys ``row * n + source`` of the edges into ``dst_ids`` (row: the
    position in ``dst_ids``), and their counts."""
    src, deg = edges.sources(dst_ids)
    row = torch.repeat_interleave(torch.arange(dst_ids.numel()), deg, output_size=src.numel())
    return torch.unique(row * edges.n + src, return_counts=True)


class CSRRows:
    """Blocks of rows of the adjacency of an :class:`InEdges` (a prepared folder's mapped CSR),
    each read from it when asked for: a block's rows are those the whole adjacency would have
    (columns ascending, a repeated edge one entry holding its count), so the products are the
    same as on the whole adjacency, bit for bit; memory: one block."""

    def __init__(self, edges: InEdges, dtype: torch.dtype) -> None:
        self.edges, self.n, self.dtype, self.ptr = edges, edges.n, dtype, edges.ptr

    def neighbours(self, ids: torch.Tensor, into: torch.Tensor) -> None:
        self.edges.neighbours(ids, into)

    def unique_edges(self) -> int:
        """The number of distinct edges (one pass, block by block)."""
        return sum(
            int(_row_keys(self.edges, ids)[0].numel())
            for _, ids in _chunks(self.ptr, None, self.n, 8 * ROW_CHUNK_EDGES)
        )

    def rows(self, dst_ids: torch.Tensor) -> torch.Tensor:
        key, counts = _row_keys(self.edges, dst_ids)
        m = dst_ids.numel()
        return _csr(indptr(key // self.n, m), key % self.n, counts.to(self.dtype), (m, self.n))


# Destination rows per block of the row-wise path: about this many edges (and at most
# ROW_CHUNK_ROWS rows), so that a block's transients stay ~100 MB at width 256.
ROW_CHUNK_EDGES = 2_000_000
ROW_CHUNK_ROWS = 65_536
EDGE_SCAN = 4_000_000  # edges read at a time by a streamed block's pass


def _chunks(ptr: torch.Tensor, dests: torch.Tensor | None, n: int, edges: int):
    """(position in the layer's output, destination ids) of consecutive blocks of ``dests``
    (every node where None) holding about ``edges`` edges and at most ROW_CHUNK_ROWS rows."""
    if dests is None:
        marks = torch.arange(0, int(ptr[-1]) + 1, max(1, edges))
        cuts = torch.searchsorted(ptr, marks)
        cuts = torch.cat([cuts, torch.arange(0, n, ROW_CHUNK_ROWS), torch.tensor([0, n])])
        bounds = torch.unique(cuts.clamp(0, n)).tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            yield a, torch.arange(a, b)
        return
    deg = ptr[dests + 1] - ptr[dests]
    ends = torch.cumsum(deg, 0)
    marks = torch.arange(0, int(ends[-1]) + 1 if ends.numel() else 1, max(1, edges))
    cuts = torch.searchsorted(ends, marks, right=True)
    m = dests.numel()
    cuts = torch.cat([cuts, torch.arange(0, m, ROW_CHUNK_ROWS), torch.tensor([0, m])])
    bounds = torch.unique(cuts.clamp(0, m)).tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        yield a, dests[a:b]


def _ranges(starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The concatenation of ``arange(s, e)`` for each pair, in order."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.long)
    offsets = torch.cumsum(lengths, 0) - lengths
    return torch.arange(total) - torch.repeat_interleave(offsets - starts, lengths)


def _rowwise(model: nn.Module) -> bool:
    """Whether every block of ``model`` takes ``((x_src, x_dst), adjacency rows)`` and returns
    the rows' outputs: gnnpar's GraphSAGE blocks (PyG's SAGEConv takes a bipartite input)."""
    from gnnpar.models.sage import SAGEBlock

    blocks = getattr(model, "blocks", None)
    return (
        bool(blocks)
        and all(type(b) is SAGEBlock for b in blocks)
        and (isinstance(getattr(model, "stem", None), nn.Identity))
    )


class HiddenStore:
    """The hidden states of the layer being computed and of the one before, each sized as it
    is (its rows: every node, or a closure's; its width: the block's output): a new layer is a
    torch tensor in memory where it fits in half of ``budget`` (bytes; default
    :func:`gnnpar.runtime.footprint.available_bytes`) beside the layer it reads (where that is
    in memory), else a numpy memmap in a temporary folder inside ``spill_dir``
    (``$GNNPAR_SPILL_DIR``, else the system's temporary folder), removed as each layer is done
    and with the store. ``in_memory`` True or False decides for every layer instead."""

    def __init__(
        self,
        budget: int | None,
        spill_dir: str | os.PathLike | None,
        in_memory: bool | None = None,
    ) -> None:
        if in_memory is None and budget is None:
            from gnnpar.runtime.footprint import available_bytes

            budget = available_bytes(torch.device("cpu"))
        self.budget = budget
        self.always = in_memory  # None: layer by layer
        self.held = 0  # bytes of the layer being read, where it is in memory
        self.pending_bytes = 0
        self.spill_dir = spill_dir or os.environ.get(SPILL_DIR_ENV) or tempfile.gettempdir()
        self.folder: Path | None = None
        self.current: Path | None = None  # the file of the layer being read
        self.pending: Path | None = None  # and of the one being written
        self.layers = 0

    def __enter__(self) -> HiddenStore:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def adjacency_fits(self, edges: int) -> bool:
        """Whether the whole sparse adjacency of ``edges`` edges, and the sort that builds it
        (~40 bytes an edge at its peak), fit in the other half of the budget."""
        return self.budget is None or 40 * edges <= self.budget // 2

    def layer(
        self, rows: int, width: int, dtype: torch.dtype, in_memory: bool = False
    ) -> torch.Tensor:
        """A new layer's ``rows`` x ``width`` hidden states, to be filled (in memory where
        ``in_memory``: the last layer's, the model's output)."""
        self.pending = None
        need = rows * width * torch.empty(0, dtype=dtype).element_size()
        fits = self.budget is None or self.held + need <= self.budget // 2
        if in_memory or (self.always if self.always is not None else fits):
            self.pending_bytes = need
            return torch.empty(rows, width, dtype=dtype)
        self.pending_bytes = 0
        if self.folder is None:
            Path(self.spill_dir).mkdir(parents=True, exist_ok=True)
            _remove_stale_spills(Path(self.spill_dir))
            self.folder = Path(
                tempfile.mkdtemp(prefix=f"gnnpar-eval-{os.getpid()}-", dir=self.spill_dir)
            )
            kind = resources.filesystem_type(self.folder)
            if kind in ("tmpfs", "ramfs"):
                print(
                    f"gnnpar: evaluation writes its hidden states to {self.folder}, a {kind} "
                    f"(memory, not disk): set ${SPILL_DIR_ENV} to a folder on a disk",
                    file=sys.stderr,
                    flush=True,
                )
        self.layers += 1
        path = self.folder / f"layer{self.layers}.npy"
        resources.check_space(path, need)
        with resources.writing(path, need):
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            arr = np.lib.format.open_memmap(path, mode="w+", dtype=np_dtype, shape=(rows, width))
            # its blocks reserved now: a disk that fills meanwhile is an error here, not a
            # SIGBUS at the first write into a page that has no block
            fd = os.open(path, os.O_RDWR)
            try:
                os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        mm = getattr(arr, "_mmap", None)  # rows are read in no order: no read-ahead around
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            mm.madvise(mmap.MADV_RANDOM)  # each (it multiplied the reads ~30x under a limit)
        self.pending = path
        return torch.from_numpy(arr)

    def advance(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` becomes the input of the next layer; the layer before it is removed."""
        if self.current is not None:
            self.current.unlink(missing_ok=True)
        self.current, self.pending = self.pending, None
        self.held = self.pending_bytes
        return out

    @property
    def on_disk(self) -> bool:
        """Whether the layer being read is a spilled one (a memmap)."""
        return self.current is not None


SPILL_DIR_ENV = "GNNPAR_SPILL_DIR"


def _remove_stale_spills(folder: Path) -> None:
    """Remove the spill folders (``gnnpar-eval-<pid>-*``) of evaluations whose process is gone
    (killed before it could remove its own: a spilled layer is gigabytes)."""
    for old in folder.glob("gnnpar-eval-*-*"):
        pid = old.name.split("-")[2]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        shutil.rmtree(old, ignore_errors=True)


def scored_nodes(data, splits: tuple[str, ...] = ("train", "val", "test")) -> torch.Tensor:
    """The nodes an evaluation scores, ascending: those of any of ``splits`` (papers100M labels
    1.4% of its nodes); every node where no split of the graph has any."""
    needed = torch.zeros(data.num_nodes, dtype=torch.bool)
    for split in splits:
        needed |= data[f"{split}_mask"].cpu()
    targets = needed.nonzero().flatten()
    if targets.numel() or any(data[f"{s}_mask"].any() for s in SPLITS):
        return targets
    return torch.arange(data.num_nodes)


def split_scores(
    out: torch.Tensor, targets: torch.Tensor, ds, splits: tuple[str, ...] = ("train", "val", "test")
) -> dict[str, float | None]:
    """The score of each of ``splits`` from ``out``, the logits of the nodes ``targets`` (row i:
    node ``targets[i]``); None for the other splits."""
    data = ds.data
    row = torch.full((data.num_nodes,), -1, dtype=torch.long)
    row[targets] = torch.arange(targets.numel())
    scores: dict[str, float | None] = {}
    for split in SPLITS:
        if split not in splits:
            scores[split] = None
            continue
        m = data[f"{split}_mask"]
        ids = m.cpu().nonzero().flatten()
        scores[split] = score(out[row[ids].to(out.device)], data.y[m], ds.multilabel)
    return scores


SPLITS = ("train", "val", "test")
SAMPLED_SPLITS = ("val", "test")  # what sampled evaluation scores (train_score: null)


@torch.no_grad()
def evaluate_graph(
    model: nn.Module, ds: GraphDataset, cache: EvalGraphCache | None = None
) -> tuple[dict[str, float], float]:
    """Full-graph inference (:func:`graph_logits`); scores on each split, and the seconds."""
    model.eval()
    t0 = time.perf_counter()
    data = ds.data
    device = next(model.parameters()).device  # no copy when the data is already there
    x, graph = _eval_graph(data, device)
    # only the nodes a split needs are scored at the last layer (papers100M labels 1.4%)
    targets = scored_nodes(data)
    out = graph_logits(model, x, graph, cache=cache, targets=targets.to(device))
    scores = split_scores(out.to(data.y.device), targets, ds)
    model.train()
    return scores, time.perf_counter() - t0


def _eval_graph(data, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | InEdges]:
    """The features and the graph evaluation reads: for a prepared folder's graph on the CPU
    whose edge_index and widened features nobody has built, its mapped CSR
    (:class:`InEdges`) and its features as stored (half precision is widened where read),
    never an in-memory copy of either; else ``data.x`` and ``data.edge_index``."""
    prepared = data.__dict__.get("_prepared")
    store = getattr(data, "_store", {})
    if prepared is not None and device.type == "cpu":
        x = store["x"] if "x" in store else prepared.tensor("features")
        if "edge_index" in store:
            return x, data.edge_index
        return x, InEdges.from_prepared(prepared)
    return data.x.to(device), data.edge_index.to(device)


@torch.no_grad()
def evaluate_sampled(
    model: nn.Module,
    ds: GraphDataset,
    batches,
    workers: int = 0,
    timeout_s: float = 120.0,
) -> tuple[dict[str, float], float]:
    """Sampled evaluation, as PyG's and DGL GraphBolt's papers100M examples evaluate: the
    validation and test nodes (:data:`SAMPLED_SPLITS`, :func:`scored_nodes`) in mini-batches
    through training's neighbour sampler and fan-outs, forward only; ``batches`` is the
    :class:`~gnnpar.data.sampling.loader.EvalBatches` over them (reproducible from the seed,
    the same from a prepared folder as from memory), made by ``workers`` loader processes.
    Memory: one batch at a time, as a training step, and the scored nodes' logits. Scores on
    val and test (train: None, not computed: papers100M's training nodes are 78% of its
    labelled ones, and their score is no measure of the model), and the seconds."""
    model.eval()
    t0 = time.perf_counter()
    out = sampled_logits(model, batches, workers, timeout_s)
    scores = split_scores(out, batches.train_idx, ds, SAMPLED_SPLITS)
    model.train()
    return scores, time.perf_counter() - t0


@torch.no_grad()
def sampled_logits(
    model: nn.Module, batches, workers: int = 0, timeout_s: float = 120.0
) -> torch.Tensor:
    """The model's fp32 outputs for the nodes of ``batches`` (an
    :class:`~gnnpar.data.sampling.loader.EvalBatches`), in their order, one batch at a time."""
    from gnnpar.data.sampling.loader import build_loader
    from gnnpar.training.losses import seed_logits

    out = None
    at = 0
    for b in build_loader(batches, 1, workers, timeout_s):
        logits = seed_logits(model, b.to_data()).float()
        if out is None:
            out = torch.empty(batches.train_idx.numel(), logits.size(1))
        out[at : at + logits.size(0)] = logits
        at += logits.size(0)
    return out


EVAL_MODES = ("auto", "layerwise", "sampled")
# the spill layer-wise inference would read per layer, under which it is taken even where its
# hidden states do not fit (reading it back is seconds)
SMALL_SPILL = 1 << 30


@dataclass
class EvalChoice:
    """How the final evaluation runs (``mode``: layerwise or sampled), with which fan-outs
    (sampled), and why (one line, for the screen)."""

    mode: str
    why: str
    fanouts: list[int] | None = None
    batch_size: int | None = None
    limited: bool = False  # a memory limit (a cgroup's) binds the run

    def record(self) -> dict[str, Any]:
        """result.json's ``eval_mode`` (and ``eval_fanouts``, ``eval_batch_size`` when sampled)."""
        if self.mode == "sampled":
            return {
                "eval_mode": "sampled",
                "eval_fanouts": list(self.fanouts or []),
                "eval_batch_size": self.batch_size,
            }
        return {"eval_mode": self.mode}

    def line(self) -> str:
        what = self.mode
        if self.mode == "sampled":
            fan = ",".join(map(str, self.fanouts or []))
            what = f"sampled (fan-outs {fan}, batches of {self.batch_size})"
        return f"gnnpar: final evaluation {what}: {self.why}"


def full_graph_record(setting: str) -> dict[str, Any]:
    """result.json's record of the final evaluation of a strategy without fan-outs (full-graph,
    Cluster-GCN): layer-wise, whatever ``--eval-mode`` (``sampled`` is refused for them)."""
    return choose_eval_mode(setting, None, None, None, None).record()


def _limited() -> bool:
    """Whether a memory limit (a cgroup's, or ``GNNPAR_MEMORY_LIMIT``) binds the run."""
    budget = resources.available_memory()
    return budget is not None and budget.limit is not None


def block_widths(model: nn.Module) -> list[int]:
    """Each block's output width (its 2-D weights' widest output dimension: GAT's heads
    concatenated); the widest weight, once, for a model without blocks."""
    blocks = getattr(model, "blocks", None) or [model]
    widest = max((max(p.shape) for p in model.parameters() if p.dim() == 2), default=1)
    return [
        max((p.shape[0] for p in b.parameters() if p.dim() == 2), default=widest) for b in blocks
    ]


def layerwise_bytes(model: nn.Module, ds: GraphDataset) -> tuple[int, int, int]:
    """(the hidden states layer-wise inference holds at once: the largest layer of N x width
    fp32 beside the one it reads; the largest layer alone; the graph it builds beside what is
    loaded already). A prepared folder's CSR is read where it is mapped (:class:`InEdges`):
    only the sparse product of a model whose blocks do not take rows (GCN) builds its whole
    adjacency (16 bytes an edge at its peak), and only such a model widens half-precision
    features whole."""
    n = int(ds.num_nodes)
    layers = [n * w * 4 for w in block_widths(model)]
    peak = max([layers[0]] + [a + b for a, b in zip(layers, layers[1:])])
    graph = 0
    if ds.info.get("prepared") and not _rowwise(model):
        convs = [m for m in model.modules() if isinstance(m, MessagePassing)]
        if convs and all(
            type(c).message_and_aggregate is not MessagePassing.message_and_aggregate for c in convs
        ):
            graph = 16 * int(ds.info.get("num_edges", 0))
        if ds.info.get("feature_dtype", "fp32") != "fp32":
            graph += 4 * n * int(ds.info.get("num_features", 0))
    return peak, max(layers), graph


def choose_eval_mode(
    setting: str,
    model: nn.Module,
    ds: GraphDataset,
    fanouts: list[int] | None,
    batch_size: int | None,
    budget: resources.MemoryBudget | None | str = "now",
) -> EvalChoice:
    """``--eval-mode``: ``layerwise`` and ``sampled`` as given; ``auto`` takes layer-wise
    inference (exact) where its hidden states fit in half of the memory the run may use
    (``budget``: :func:`gnnpar.runtime.footprint.memory_budget`, a cgroup's limit where there
    is one) beside the graph it would build, or where the spill it would read is small
    (:data:`SMALL_SPILL` a layer), and sampled evaluation otherwise. Only sampled training
    has fan-outs (``fanouts`` None): there ``auto`` is layer-wise."""
    if setting == "layerwise":
        return EvalChoice("layerwise", "--eval-mode layerwise")
    if setting == "sampled":
        return EvalChoice("sampled", "--eval-mode sampled", fanouts, batch_size, _limited())
    if fanouts is None:
        return EvalChoice("layerwise", "only sampled training has fan-outs to sample with")
    if budget == "now":
        from gnnpar.runtime.footprint import memory_budget

        budget = memory_budget(torch.device("cpu"))
    hidden, largest, graph = layerwise_bytes(model, ds)
    gb = resources.size_words
    need = f"layer-wise inference's hidden states ({gb(hidden)} at once)" + (
        f" and the graph it builds ({gb(graph)})" if graph else ""
    )
    if budget is None:
        return EvalChoice("layerwise", "the memory the run may use is unknown")
    half = budget.free // 2
    if graph <= half and (hidden <= half or largest <= SMALL_SPILL):
        how = "fit in" if hidden <= half else "spill little beyond"
        return EvalChoice("layerwise", f"{need} {how} half of {budget.words()}")
    return EvalChoice(
        "sampled",
        f"{need} would not fit in half of {budget.words()}",
        fanouts,
        batch_size,
        budget.limit is not None,
    )


@torch.no_grad()
def evaluate_images(
    model: nn.Module, ds: ImageDataset, batch_size: int, max_steps: int | None = None
) -> tuple[dict[str, float], list[float]]:
    """Scores on val and test in mini-batches, and the time of each test mini-batch."""
    model.eval()
    device = next(model.parameters()).device
    scores, test_times = {}, []
    for split in ("val", "test"):
        x, y = getattr(ds, f"{split}_x"), getattr(ds, f"{split}_y")
        correct, seen = 0, 0
        for step, (bx, by) in enumerate(image_batches(x, y, batch_size, None)):
            if max_steps is not None and step >= max_steps:
                break
            t0 = time.perf_counter()
            pred = model(bx.to(device)).argmax(-1).cpu()  # .cpu() waits for an accelerator
            if split == "test":
                test_times.append(time.perf_counter() - t0)
            correct += int((pred == by).sum())
            seen += by.numel()
        scores[split] = correct / max(seen, 1)
    model.train()
    return scores, test_times
