"""GCN (Kipf & Welling, ICLR 2017): dropout -> GCNConv -> ReLU, repeated; PyG's GCNConv.

The first block takes its input dropout and projection from :class:`SparseInputLinear` (see
``models/gat.py``): bag-of-words features such as Cora's are ~99% zeros, so dropping out only the
non-zeros and multiplying in CSR form is the same computation at a fraction of the cost.

The propagation ``D^-1/2 (A + I) D^-1/2 (x W)`` is one sparse (CSR) matrix product rather than
PyG's gather / multiply / scatter of one 128-wide message per edge (issue 21: 115 -> ~25 ms a
study-003 Cluster-GCN step on synthetic-reddit 0.1, where the messages were 80% of the time).
The normalised adjacency is PyG's own ``gcn_norm`` of the same edges, put in CSR form with its
transpose (for the backward) and kept for a graph seen again: Cluster-GCN trains the same
subgraphs every epoch (:class:`GCNAdjacencyCache`). The sums are the same; only their rounding
order differs from PyG's scatter (tests/models/test_gcn_spmm.py).
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict

import torch
from torch import nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnpar.csr import indptr
from gnnpar.models import gat_kernel
from gnnpar.models.base import BlockModel, output_head
from gnnpar.models.dropout import dropout
from gnnpar.models.gat import SparseInputLinear


class GCNAdjacencyCache:
    """Normalised CSR adjacencies (and transposes) of the graphs a process propagated over,
    least recently used first out, at most ``max_edges`` edges in all.

    A graph is found by where its ``edge_index`` lies in memory (pointer, shape, strides) and
    then confirmed: the same tensor object whose version counter (bumped by every in-place
    write) has not moved since it was last confirmed, or else contents equal to a copy kept of
    it, so a tensor changed in place or a new one at a freed address is never mistaken for the
    one cached. (Comparing the contents on every call cost ~0.2 ms a layer of a study-003
    step.) A graph larger than the whole budget is built on every call and not kept.
    """

    def __init__(self, max_edges: int = 4_000_000) -> None:
        self.max_edges = max_edges
        self.entries: OrderedDict[tuple, tuple] = OrderedDict()
        self.edges = 0

    def get(self, edge_index: torch.Tensor, num_nodes: int, dtype, improved: bool, loops: bool):
        key = (
            edge_index.data_ptr(),
            tuple(edge_index.shape),
            edge_index.stride(),
            str(edge_index.device),
            num_nodes,
            dtype,
            improved,
            loops,
        )
        hit = self.entries.get(key)
        if hit is not None and (
            (hit[3]() is edge_index and hit[4] == edge_index._version)
            or torch.equal(hit[0], edge_index)
        ):
            self.entries.move_to_end(key)
            self.entries[key] = (*hit[:3], weakref.ref(edge_index), edge_index._version)
            return hit[1], hit[2]
        a, at = normalised_adjacency(edge_index, num_nodes, dtype, improved, loops)
        size = int(edge_index.size(1))
        if size <= self.max_edges:
            if hit is not None:
                self.edges -= int(hit[0].size(1))
            keep = (edge_index.clone(), a, at, weakref.ref(edge_index), edge_index._version)
            self.entries[key] = keep
            self.edges += size
            while self.edges > self.max_edges:
                old = self.entries.popitem(last=False)[1]
                self.edges -= int(old[0].size(1))
        return a, at


ADJACENCY = GCNAdjacencyCache()


def normalised_adjacency(
    edge_index: torch.Tensor, num_nodes: int, dtype, improved: bool = False, loops: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``D^-1/2 (A + I) D^-1/2`` as GCNConv computes it (row = target, column = source), in CSR
    form, and its transpose. Each row holds its entries in the order PyG's scatter adds them
    (the edges as given, then the self-loops; repeated edges apart), so the sums are rounded
    alike on every CPU: with coalesced (column-sorted) rows an Intel Xeon's MKL product moved
    the pinned Cluster-GCN curve by one rounding, where an AMD EPYC's did not."""
    ei, w = gcn_norm(edge_index, None, num_nodes, improved, loops, "source_to_target", dtype)

    def csr(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        # each row's entries in gcn_norm's order (the edges as given, then the self-loops),
        # repeated edges kept apart: the order in which PyG's scatter adds the messages
        order = torch.sort(rows, stable=True).indices
        with warnings.catch_warnings():  # "CSR support is in beta": the ops used are stable
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                indptr(rows, num_nodes),
                cols[order],
                w[order],
                (num_nodes, num_nodes),
                check_invariants=False,
            )

    return csr(ei[1], ei[0]), csr(ei[0], ei[1])


class _Propagate(torch.autograd.Function):
    """``A @ h`` for a constant sparse ``A``; the backward multiplies by the kept ``A^T``."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, at: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        ctx.at = at
        return gat_kernel.csr_mm(a, h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, None, gat_kernel.csr_mm(ctx.at, grad)


def gcn_propagate(conv: GCNConv, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """``conv(x, edge_index)`` for PyG's GCNConv with its default settings, as a CSR product."""
    h = conv.lin(x)
    a, at = ADJACENCY.get(edge_index, x.size(0), h.dtype, conv.improved, conv.add_self_loops)
    out = _Propagate.apply(a, at, h)
    return out if conv.bias is None else out + conv.bias


def _fast(conv: GCNConv, x: torch.Tensor, edge_index) -> bool:
    """The CSR product covers GCNConv's default path: a plain edge list (a sparse adjacency goes
    PyG's way), no cached or skipped normalisation, float32/float64 features (sparse products
    of half types are not on CPU)."""
    return (
        isinstance(edge_index, torch.Tensor)
        and edge_index.layout == torch.strided  # not a sparse adjacency (full-graph evaluation)
        and edge_index.dim() == 2
        and not edge_index.is_floating_point()
        and conv.normalize
        and not conv.cached
        and conv.flow == "source_to_target"
        and x.dtype in (torch.float32, torch.float64)
        and not torch.is_autocast_enabled(x.device.type)
    )


class GCNBlock(nn.Module):
    def __init__(
        self, in_dim: int, out_dim: int, p: float, last: bool, sparse_input: bool = False
    ) -> None:
        super().__init__()
        self.dropout = p
        self.conv = GCNConv(in_dim, out_dim, cached=False)
        self.last = last
        self.sparse_input = sparse_input
        if sparse_input:
            lin = SparseInputLinear(in_dim, out_dim, p)
            lin.weight = self.conv.lin.weight  # keep GCNConv's own initialisation
            self.conv.lin = lin

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        if not self.sparse_input:
            x = dropout(x, self.dropout, self.training)
        if _fast(self.conv, x, edge_index):
            x = gcn_propagate(self.conv, x, edge_index)
        else:
            x = self.conv(x, edge_index)
        return x if self.last else torch.relu(x)


def build_gcn(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    dims = [in_dim] + [mcfg.hidden] * (mcfg.layers - 1) + [num_classes]
    blocks = [
        GCNBlock(dims[i], dims[i + 1], mcfg.dropout, last=i == mcfg.layers - 1, sparse_input=i == 0)
        for i in range(mcfg.layers)
    ]
    return BlockModel(blocks, head=output_head(multilabel))
