"""Per-layer trimming of a neighbour-sampled batch, and the mean aggregation as a CSR product.

A batch of :mod:`gnnpar.data.sampling` lists its nodes by hop (the seeds, then the nodes first
reached at hop 1, 2, ...) and its edges by hop (hop ``k``'s edges point from a node of hop
``<= k`` to a node of hop ``k - 1``). A node of hop ``k`` aggregates exactly the edges sampled at
hop ``k + 1``: it was a frontier node once, then. So an ``L``-layer GNN's layer ``l``
(0-based) only needs outputs for the nodes within ``L - l - 1`` hops of the seeds, which read
the nodes within ``L - l`` hops along the edges of hops ``1 .. L - l``: node and edge prefixes
of the batch (PyG's ``trim_to_layer``, DGL's blocks). The seeds' outputs are the same as when
every layer runs on the whole subgraph; only the rows nobody reads are not computed.

:class:`HopGraph` is what a trimming-aware :class:`~gnnpar.models.base.BlockModel` gets instead
of ``edge_index``; :meth:`HopGraph.layer` gives a block its :class:`HopLayer` (source rows =
the input's rows, destination rows = a prefix of them, the output's rows). A block that does not
know about hops gets the whole ``edge_index`` (BlockModel decides, see there).

:class:`MeanAdjacency` is a layer's row-normalised adjacency (``1 / in-degree`` per edge) in CSR
with its transpose, for ``mean_j h_j`` as one CSR product (``gat_kernel.csr_mm``) forward and
one backward instead of a gather of a row per edge plus a scatter (PyG's message passing): on
synthetic-reddit 0.1 at 256 columns ~5x cheaper on one CPU thread (BENCHMARKS.md, issue 21).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from gnnpar.csr import indptr
from gnnpar.models import gat_kernel
from gnnpar.models.reused import ReusedRows


def _csr(crow, col, values, shape) -> torch.Tensor:
    with warnings.catch_warnings():  # "CSR support is in beta": the ops used here are stable
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


@dataclass
class MeanAdjacency:
    """``A[i, j] = 1 / deg(i)`` for each edge ``j -> i`` of a layer: ``A @ h`` is the mean of
    ``h`` over each destination's in-neighbours (0 for a destination without any)."""

    crow: torch.Tensor  # [n_dst + 1]
    col: torch.Tensor  # [E] source of each edge, grouped by destination
    values: torch.Tensor  # [E] float32
    n_src: int
    n_dst: int
    dst: torch.Tensor  # [E] destination of each edge (sorted)
    _t: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, src: torch.Tensor, dst: torch.Tensor, n_src: int, n_dst: int):
        """From edges sorted by destination (``dst`` non-decreasing)."""
        crow = indptr(dst, n_dst)
        deg = (crow[1:] - crow[:-1]).clamp_min_(1).to(torch.float32)
        return cls(crow, src, deg.reciprocal_()[dst], n_src, n_dst, dst)

    def matrix(self) -> torch.Tensor:
        return _csr(self.crow, self.col, self.values, (self.n_dst, self.n_src))

    def transposed(self) -> torch.Tensor:
        """``A^T`` [n_src, n_dst] in CSR (built on first use: only a backward needs it)."""
        if self._t is None:
            t_crow, order = gat_kernel.order_by_key(self.col, self.n_src)
            self._t = (t_crow, self.dst[order], self.values[order])
        crow, col, values = self._t
        return _csr(crow, col, values, (self.n_src, self.n_dst))


class _MeanAggregate(torch.autograd.Function):
    """``A @ h`` and its backward ``A^T @ grad``, both CSR products in float32 (CPU has no
    bfloat16 CSR product; under autocast the result goes back to ``h``'s dtype)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, adj: MeanAdjacency, reuse: ReusedRows | None) -> torch.Tensor:
        ctx.adj, ctx.dtype = adj, h.dtype
        out = None
        if reuse is not None and h.dtype == torch.float32 and h.device.type == "cpu":
            out = reuse.take(adj.n_dst, h.size(1))
        with torch.autocast(h.device.type, enabled=False):
            return gat_kernel.csr_mm(adj.matrix(), h.float(), out=out).to(h.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        with torch.autocast(grad.device.type, enabled=False):
            out = gat_kernel.csr_mm(ctx.adj.transposed(), grad.float()).to(ctx.dtype)
        return out, None, None


def mean_aggregate(
    h: torch.Tensor, adj: MeanAdjacency, reuse: ReusedRows | None = None
) -> torch.Tensor:
    """Mean of ``h``'s rows over each destination's in-neighbours: [n_dst, features]; float32
    on the CPU, in ``reuse``'s block when given (:class:`~gnnpar.models.reused.ReusedRows`)."""
    return _MeanAggregate.apply(h, adj, reuse)


@dataclass
class HopLayer:
    """What layer ``l`` reads and writes: the first ``n_src`` nodes in, the first ``n_dst`` out,
    along ``edge_index`` (the batch's edges of hops ``1 .. L - l``, local ids)."""

    edge_index: torch.Tensor
    n_src: int
    n_dst: int
    _adj: MeanAdjacency | None = field(default=None, repr=False)

    def mean_adjacency(self) -> MeanAdjacency:
        if self._adj is None:
            src, dst = self.edge_index[0], self.edge_index[1]
            self._adj = MeanAdjacency.build(src, dst, self.n_src, self.n_dst)
        return self._adj


class HopGraph:
    """A sampled batch's edges with its nodes and edges per hop (as the sampler reports them:
    ``num_sampled_nodes[0]`` seeds, then the nodes new at each hop; ``num_sampled_edges[k]``
    the edges of hop ``k + 1``).

    ``edge_index`` is kept as given (``edge_index`` attribute, for blocks that do not trim);
    the layers read a copy sorted by destination (stable, so each hop's edges stay together:
    hop ``k``'s destinations are the nodes of hop ``k - 1``, a range of ids above hop
    ``k - 2``'s). The compiled sampler emits them sorted already; the torch fallback does not.
    """

    def __init__(
        self,
        edge_index: torch.Tensor,
        num_sampled_nodes: list[int],
        num_sampled_edges: list[int],
    ) -> None:
        if len(num_sampled_nodes) != len(num_sampled_edges) + 1:
            raise ValueError(
                f"{len(num_sampled_nodes)} node counts for {len(num_sampled_edges)} hops of "
                "edges: expected one more node count (the seeds) than hops"
            )
        if sum(num_sampled_edges) != edge_index.size(1):
            raise ValueError(
                f"the hops' edge counts sum to {sum(num_sampled_edges)}, edge_index has "
                f"{edge_index.size(1)} edges"
            )
        self.edge_index = edge_index
        self.hops = len(num_sampled_edges)
        self.nodes_upto = [0] * (self.hops + 2)  # nodes_upto[k + 1]: nodes of hops <= k
        for k, n in enumerate(num_sampled_nodes):
            self.nodes_upto[k + 1] = self.nodes_upto[k] + int(n)
        self.edges_upto = [0]
        for e in num_sampled_edges:
            self.edges_upto.append(self.edges_upto[-1] + int(e))
        dst = edge_index[1]
        if dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()):
            edge_index = edge_index[:, torch.sort(dst, stable=True).indices]
        self._sorted = edge_index
        self._layers: dict[tuple[int, int], HopLayer] = {}

    @classmethod
    def of(cls, batch) -> HopGraph | None:
        """The batch's HopGraph, or None when it does not say what it sampled per hop."""
        nodes = getattr(batch, "num_sampled_nodes", None)
        edges = getattr(batch, "num_sampled_edges", None)
        if nodes is None or edges is None:
            return None
        return cls(batch.edge_index, list(nodes), list(edges))

    @property
    def num_nodes(self) -> int:
        return self.nodes_upto[-1]

    def layer(self, index: int, num_layers: int) -> HopLayer:
        """Layer ``index`` of a ``num_layers``-layer model whose last layer's output rows are the
        seeds. Needs ``num_layers <= hops``; with fewer layers than hops the outermost hops are
        simply not read."""
        if not 0 <= index < num_layers <= self.hops:
            raise ValueError(
                f"layer {index} of {num_layers}: the batch was sampled for {self.hops} hops"
            )
        key = (index, num_layers)
        if key not in self._layers:
            reach = num_layers - index  # hops this layer's inputs span
            e = self.edges_upto[reach]
            self._layers[key] = HopLayer(
                self._sorted[:, :e], self.nodes_upto[reach + 1], self.nodes_upto[reach]
            )
        return self._layers[key]
