"""GAT (Velickovic et al., ICLR 2018) as study 001 uses it, and the 3-layer variant of study 002.

``gat`` (study 001, section 6): dropout 0.6 -> GATConv(8 heads x 8, concatenated, attention
dropout 0.6) -> ELU -> dropout 0.6 -> GATConv(classes, 8 heads averaged, attention dropout 0.6)
-> log-softmax. ``gat3`` (study 002, table 1): three GATConv layers of 16 hidden units, 1 head,
dropout 0.6 before each. Blocks are ``dropout -> GATConv (-> ELU)`` so a pipeline can cut
between any two layers. With the study's dropout, gat3 stays at chance on synthetic-reddit (0.6
on 16 single-head units leaves too little to carry 41 classes); ``--dropout 0.2`` reaches 0.97
in 3 epochs (benchmarks/HISTORY.md, "Why gat3 stays at chance").

Three CPU costs of plain PyG are avoided without changing the model:

* Sparse input features. Bag-of-words inputs such as Cora's (2708 x 1433, 98.7% zeros) make plain
  PyG spend most of a CPU epoch drawing dropout random numbers for the zeros and multiplying them
  by the first weight matrix. The first block's projection (:class:`SparseInputLinear`) keeps a
  CSR copy of a mostly-zero input, drops out only its non-zeros (a dropped zero stays zero, so
  every element has exactly the distribution of dense dropout: kept with probability 1-p and
  scaled by 1/(1-p)) and multiplies with a CSR product (``gat_kernel.csr_mm``). Strategies
  still pass ordinary dense ``x``: the CSR copy is cached on the tensor object and its version
  counter, so a new tensor or an in-place change is noticed. In eval mode the output equals
  the dense path up to float rounding (a different summation order).
* Dropout masks. ``bernoulli_`` on CPU costs ~10 ns per element; the input, hidden and
  attention dropouts draw their masks from a counter-based hash instead
  (:mod:`gnnpar.models.dropout`: the same distribution; forward and backward ~2x cheaper than
  a ``torch.rand`` mask and ~5x than ``F.dropout``); on GPU it is ``F.dropout``.
* Attention on a neighbour-sampled layer (:func:`attention_layer`): GATConv's function for the
  layer's destination rows only, its softmax as segment max/sum over a CSR by destination and
  its weighted sum as one CSR product (gat3's sampled step 178-180 -> 154-158 ms on
  one thread, BENCHMARKS.md issue 21). Full-batch graphs keep PyG's GATConv (with 8 heads the
  per-head CSR products were slower).
* The edge softmax (:class:`_EdgeSoftmax`, both paths above): ``gat_kernel.c`` computes it in
  two OpenMP passes over the rows forward and two backward, where torch needs ~12 small
  operations each way, a few of them serial (segment_reduce, and scatters as their backward):
  the same float operations in the same order, so the same bits (issue 21: Cora's step at two
  threads, BENCHMARKS.md). Without a compiler it is those torch operations.

    gnnpar train --dataset cora --model gat
    gnnpar train --dataset cora --model gat3 --epochs 50
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.utils import softmax

from gnnpar.csr import indptr, rows_origin
from gnnpar.models import gat_kernel
from gnnpar.models.base import BlockModel, output_head
from gnnpar.models.dropout import dropout, factors
from gnnpar.models.hops import HopLayer

# The edge softmax through the compiled kernel where it is built (False: torch's operations;
# the two agree to the bit, tests/models/test_gat_full_csr.py).
FUSED_SOFTMAX = True

# Inputs with at most this fraction of non-zeros take the sparse path. At Cora's 1.3% the CSR
# product is ~20x cheaper than the dense one; near 10% the two cost about the same on CPU.
MAX_SPARSE_DENSITY = 0.1


# ------------------------------------------------------------------------------- sparse inputs
@dataclass
class CSRPlan:
    """A mostly-zero matrix X [n, f] as CSR, and the structure of X^T for the backward pass."""

    crow: torch.Tensor
    col: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, int]
    t_crow: torch.Tensor  # CSR structure of X^T [f, n]
    t_col: torch.Tensor
    t_perm: torch.Tensor  # X^T's values are values[t_perm]

    @classmethod
    def from_dense(cls, x: torch.Tensor) -> CSRPlan:
        n, f = x.shape
        row, col = x.nonzero(as_tuple=True)  # row-major order: already CSR order
        crow = indptr(row, n)
        t_perm = torch.argsort(col * n + row)
        t_crow = indptr(col, f)
        return cls(crow, col, x[row, col], (n, f), t_crow, row[t_perm], t_perm)

    def rows(self, index: torch.Tensor) -> CSRPlan:
        """The plan of ``X[index]`` (:meth:`SparseRows.rows`)."""
        return SparseRows(self.crow, self.col, self.values, self.shape).rows(index)

    def matrix(self, values: torch.Tensor) -> torch.Tensor:
        return _csr(self.crow, self.col, values, self.shape)

    def transposed(self, values: torch.Tensor) -> torch.Tensor:
        return _csr(self.t_crow, self.t_col, values[self.t_perm], (self.shape[1], self.shape[0]))


@dataclass
class SparseRows:
    """A mostly-zero matrix X [n, f] as CSR only (no transposed structure: a third of a
    :class:`CSRPlan`'s memory), kept to gather the plans of row subsets of X from."""

    crow: torch.Tensor
    col: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, int]

    @classmethod
    def from_dense(cls, x: torch.Tensor) -> SparseRows:
        row, col = x.nonzero(as_tuple=True)  # row-major order: already CSR order
        return cls(indptr(row, x.size(0)), col, x[row, col], tuple(x.shape))

    def rows(self, index: torch.Tensor) -> CSRPlan:
        """The plan of ``X[index]``, equal entry for entry to ``CSRPlan.from_dense(X[index])``:
        each row's entries gathered in their (column) order, in O(entries of those rows)."""
        start = self.crow[index]
        counts = self.crow[index + 1] - start
        n, f, device = index.numel(), self.shape[1], self.crow.device
        crow = torch.zeros(n + 1, dtype=torch.long, device=device)
        torch.cumsum(counts, 0, out=crow[1:])
        # entry k of row r sits at start[r] + k in X's lists, at crow[r] + k in this one
        at = torch.repeat_interleave(start - crow[:-1], counts, output_size=int(crow[-1]))
        at += torch.arange(at.numel(), device=device)
        col = self.col[at]
        row = torch.repeat_interleave(
            torch.arange(n, device=device), counts, output_size=at.numel()
        )
        t_perm = torch.argsort(col * n + row)
        return CSRPlan(crow, col, self.values[at], (n, f), indptr(col, f), row[t_perm], t_perm)


def _csr(crow, col, values, shape) -> torch.Tensor:
    with warnings.catch_warnings():  # "CSR support is in beta": the ops used here are stable
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


class _CSRMatmul(torch.autograd.Function):
    """X @ W for CSR X; the backward uses the cached X^T structure instead of re-sorting X.

    Always fp32, also under ``--precision bf16``'s autocast (which would cast both operands
    of ``sparse.mm`` to bfloat16): CPU has no bfloat16 CSR product, and this one is ~1% of
    the dense product's work anyway. Inside a Function autocast casts no inputs, so the
    operands keep their dtype (fp32 features and weights); the next layer's autocast casts the
    output."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, w: torch.Tensor, plan: CSRPlan) -> torch.Tensor:
        ctx.plan = plan
        ctx.save_for_backward(values)
        with torch.autocast(values.device.type, enabled=False):
            return gat_kernel.csr_mm(plan.matrix(values), w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (values,) = ctx.saved_tensors
        with torch.autocast(values.device.type, enabled=False):
            grad_w = gat_kernel.csr_mm(ctx.plan.transposed(values), grad)
        return None, grad_w, None


class TensorKeyedCache:
    """Values derived from tensors, kept while each tensor lives unchanged: an entry is keyed on
    the tensor object itself (a weak reference, so the cache keeps no data alive; a dead
    tensor's entry goes at once), its version counter (every in-place write bumps it) and an
    ``extra`` key; at most ``capacity`` entries, least recently used out first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple, tuple[weakref.ref, int, object]] = OrderedDict()

    def __getstate__(self) -> dict:  # copies and pickles start empty (weak references can't)
        return {**self.__dict__, "_entries": OrderedDict()}

    def _cached(self, t: torch.Tensor, extra, make):
        key = (id(t), extra)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is t and entry[1] == t._version:
            self._entries.move_to_end(key)
            return entry[2]
        value = make()

        def forget(ref: weakref.ref) -> None:  # the tensor died: drop its value now
            if key in self._entries and self._entries[key][0] is ref:
                del self._entries[key]

        self._entries[key] = (weakref.ref(t, forget), t._version, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return value


class SparseFeatures(TensorKeyedCache):
    """The :class:`CSRPlan` of each mostly-zero dense input seen recently (``capacity`` of them;
    :class:`TensorKeyedCache`). Several entries, because Cluster-GCN feeds a different
    subgraph's features every step and evaluation feeds the full graph's; a different or
    modified tensor is examined again. Inputs denser than ``max_density`` are remembered as
    ``None``. An input that is rows of a larger matrix (a sampled batch's features, marked with
    :func:`gnnpar.csr.mark_rows`) gathers its plan from that matrix's, made once, instead of
    examining each of its elements; it takes the same path (and, so, draws the same dropout
    numbers) as it would if examined.
    """

    def __init__(self, max_density: float = MAX_SPARSE_DENSITY, capacity: int = 64) -> None:
        super().__init__(capacity)
        self.max_density = max_density

    def _surely_dense(self, x: torch.Tensor) -> bool:
        """Whether every 64th row alone is over twice the density limit: then ``x`` is taken as
        dense without counting all of it (a sampled batch's features are a new tensor every
        step; counting 23K x 602 floats cost ~6 ms of a ~150 ms gat3 step). Deterministic in
        ``x``; a borderline input is counted in full."""
        return self._probe_says_dense(
            x.size(0), x.size(1), lambda step: int(torch.count_nonzero(x[::step]))
        )

    def _probe_says_dense(self, n: int, f: int, nonzeros_every) -> bool:
        """The probe's rule for an ``n x f`` input, from ``nonzeros_every(step)``: the non-zeros
        in its rows ``0, step, 2 step, ...`` (counted from the dense input, or from a gathered
        plan's row lengths: the same decision either way)."""
        if n < 4096:
            return False
        step = n // 64
        return nonzeros_every(step) > 2 * self.max_density * len(range(0, n, step)) * f

    def get(self, x: torch.Tensor) -> CSRPlan | None:
        return self._cached(x, None, lambda: self._plan(x))

    def _sparse_enough(self, x: torch.Tensor) -> bool:
        """Whether ``x`` takes the CSR path (its whole density counted unless clearly dense)."""
        usable = x.dim() == 2 and x.layout == torch.strided and x.is_floating_point()
        if not usable or x.requires_grad or x.numel() == 0 or self._surely_dense(x):
            return False
        return int(torch.count_nonzero(x)) <= self.max_density * x.numel()

    def _plan(self, x: torch.Tensor) -> CSRPlan | None:
        usable = x.dim() == 2 and x.layout == torch.strided and x.is_floating_point()
        if not usable or x.requires_grad or x.numel() == 0:
            return None
        plan = self._rows_plan(x)
        if plan is not None:  # _sparse_enough's decision, from the gathered plan's row lengths
            counts = plan.crow[1:] - plan.crow[:-1]
            if self._probe_says_dense(x.size(0), x.size(1), lambda step: int(counts[::step].sum())):
                return None
            return plan if int(plan.crow[-1]) <= self.max_density * x.numel() else None
        return CSRPlan.from_dense(x) if self._sparse_enough(x) else None

    def _rows_plan(self, x: torch.Tensor) -> CSRPlan | None:
        """The plan of ``x`` gathered from the whole matrix's, when ``x`` is marked as rows of
        a mostly-zero matrix of its kind; else None (``x`` is then examined itself)."""
        origin = rows_origin(x)
        if origin is None:
            return None
        whole, index = origin
        if whole.dtype != x.dtype or whole.device != x.device or whole.shape[1:] != x.shape[1:]:
            return None
        source = self._cached(
            whole,
            "rows",
            lambda: SparseRows.from_dense(whole) if self._sparse_enough(whole) else None,
        )
        return None if source is None else source.rows(index)


class SparseInputLinear(Linear):
    """Input dropout followed by PyG's ``Linear``; a mostly-zero input goes the CSR way.

    It replaces GATConv's own projection in the first block, so the dropout that study 001 puts
    before the first layer happens here, where the sparsity of the input is known.
    """

    def __init__(self, in_dim: int, out_dim: int, dropout: float) -> None:
        super().__init__(in_dim, out_dim, bias=False, weight_initializer="glorot")
        self.dropout = dropout
        self.sparse = SparseFeatures()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = self.sparse.get(x)
        if plan is None:
            return super().forward(dropout(x, self.dropout, self.training))
        values = dropout(plan.values, self.dropout, self.training)
        return _CSRMatmul.apply(values, self.weight.t(), plan)


# ---------------------------------------------------------------------------------- the layers
class FastDropoutGATConv(GATConv):
    """PyG's GATConv; its attention dropout draws the mask with :func:`dropout`, and on CPU its
    sum over incoming edges is ``index_add_`` (see :meth:`aggregate`)."""

    def aggregate(self, inputs, index, ptr=None, dim_size=None) -> torch.Tensor:
        """PyG sums messages with ``scatter_add_`` on an index broadcast over the features; with
        more than one thread torch then sorts the index on every call before a parallel sum
        (issue 21: at 2 threads CiteSeer's step took 104-156 ms this way against 54-105 ms with
        ``index_add_``, 25 ms at one thread either way). ``index_add_`` adds each message into
        its row in edge order, as the serial scatter does: the same sums, bit for bit
        (tests/models/test_models.py)."""
        if inputs.device.type != "cpu" or dim_size is None or self.node_dim != 0:
            return super().aggregate(inputs, index, ptr, dim_size)
        return inputs.new_zeros((dim_size, *inputs.shape[1:])).index_add_(0, index, inputs)

    def edge_update(self, alpha_j, alpha_i, edge_attr, index, ptr, dim_size) -> torch.Tensor:
        if edge_attr is not None or index.numel() == 0:
            return super().edge_update(alpha_j, alpha_i, edge_attr, index, ptr, dim_size)
        alpha = alpha_j if alpha_i is None else alpha_j + alpha_i
        alpha = F.leaky_relu(alpha, self.negative_slope)
        alpha = softmax(alpha, index, ptr, dim_size)
        return dropout(alpha, self.dropout, self.training)


# ---------------------------------------------------------------------- attention as a CSR
@dataclass
class AttentionCSR:
    """A layer's edges as GATConv reads them, in CSR by destination: existing self-loops
    removed, one self-loop added per destination (``add_self_loops``; the loops GATConv adds
    for the source-only rows of a sampled layer feed rows nobody reads). Each row holds its
    edges in the given order, then its loop: PyG's order within every row.

    ``order`` (whole graphs, :meth:`of_graph`): the index in PyG's own entry list (the kept
    edges as given, then the ``n`` loops) of each CSR entry, so that attention dropout can draw
    its mask in PyG's order and the transpose can hold each source's entries in that order."""

    crow: torch.Tensor  # [n_dst + 1]
    col: torch.Tensor  # [E] source of each entry
    row: torch.Tensor  # [E] destination of each entry (non-decreasing)
    n_src: int
    n_dst: int
    order: torch.Tensor | None = None
    _t: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    _by_src: tuple[torch.Tensor, torch.Tensor] | None = None
    _heads: dict = field(default_factory=dict)

    @classmethod
    def of(cls, layer: HopLayer) -> AttentionCSR:
        """A sampled layer: its edges sorted by destination already (the sampler's order)."""
        src, dst = layer.edge_index[0], layer.edge_index[1]
        loops = src == dst
        if bool(loops.any()):
            src, dst = src[~loops], dst[~loops]
        n, e = layer.n_dst, src.numel()
        count = torch.bincount(dst, minlength=n).add_(1)
        crow = torch.zeros(n + 1, dtype=torch.long)
        torch.cumsum(count, 0, out=crow[1:])
        col = torch.empty(e + n, dtype=torch.long)
        col[torch.arange(e).add_(dst)] = src  # an edge into row d follows d loops
        col[crow[1:] - 1] = torch.arange(n)
        row = torch.repeat_interleave(torch.arange(n), count, output_size=e + n)
        return cls(crow, col, row, layer.n_src, n)

    @classmethod
    def of_graph(cls, edge_index: torch.Tensor, n: int) -> AttentionCSR:
        """A whole graph of ``n`` nodes, its edges in any order (GATConv's full-batch input)."""
        src, dst = edge_index[0], edge_index[1]
        keep = src != dst
        if not bool(keep.all()):
            src, dst = src[keep], dst[keep]
        loops = torch.arange(n, dtype=src.dtype, device=src.device)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])  # PyG's entries
        order = torch.sort(dst, stable=True).indices  # by row; a row's loop stays last
        row = dst[order]
        adj = cls(indptr(row, n), src[order], row, n, n, order)
        by_src = torch.sort(src, stable=True).indices  # each source's entries in PyG's order
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel(), device=order.device)
        adj._t = (indptr(src, n), dst[by_src], position[by_src])
        return adj

    def matrix(self, values: torch.Tensor) -> torch.Tensor:
        return _csr(self.crow, self.col, values, (self.n_dst, self.n_src))

    def _transpose(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``A^T``'s row offsets, columns, and the ``A`` entry of each of its entries."""
        if self._t is None:
            t_crow, order = gat_kernel.order_by_key(self.col, self.n_src)
            self._t = (t_crow, self.row[order], order)
        return self._t

    def by_source(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``A^T``'s row offsets and, per source, its entries in ``A``'s entry order: the
        order in which a one-thread scatter by ``col`` adds them."""
        if self.order is None:  # _transpose's order is this one
            crow, _, entries = self._transpose()
            return crow, entries
        if self._by_src is None:
            self._by_src = gat_kernel.order_by_key(self.col, self.n_src)
        return self._by_src

    def transposed(self, values: torch.Tensor) -> torch.Tensor:
        """``A^T`` [n_src, n_dst] with ``values`` given in ``A``'s entry order."""
        crow, col, order = self._transpose()
        return _csr(crow, col, values[order], (self.n_src, self.n_dst))

    def heads(self, k: int) -> HeadsCSR:
        """The ``k`` heads' attention matrices as one block-diagonal CSR (:class:`HeadsCSR`)."""
        if k not in self._heads:
            self._heads[k] = HeadsCSR.of(self, k)
        return self._heads[k]


@dataclass
class HeadsCSR:
    """``k`` attention heads over the same edges as one CSR: row ``i * k + h`` holds row ``i``'s
    entries for head ``h`` (columns ``j * k + h``), so that ``h.view(n_src * k, c)`` is
    multiplied by every head at once (one CSR product instead of one per head).
    ``take`` / ``take_t``: the flat index into ``alpha.view(-1)`` (``alpha``: [E, k], ``A``'s
    entry order) of each entry of the matrix and of its transpose."""

    crow: torch.Tensor
    col: torch.Tensor
    take: torch.Tensor | None  # None: one head, alpha's entries in order
    t_crow: torch.Tensor
    t_col: torch.Tensor
    take_t: torch.Tensor
    shape: tuple[int, int]

    @classmethod
    def of(cls, adj: AttentionCSR, k: int) -> HeadsCSR:
        t_crow, t_col, t_entry = adj._transpose()
        shape = (adj.n_dst * k, adj.n_src * k)
        if k == 1:  # the matrix itself: its entries are alpha's rows in order
            a, t = _narrow(adj.crow, adj.col, max(shape)), _narrow(t_crow, t_col, max(shape))
            return cls(*a, None, *t, t_entry, shape)
        heads = torch.arange(k)
        t_row = torch.repeat_interleave(torch.arange(adj.n_src), torch.diff(t_crow))

        def expand(rows, cols, entries, n_rows):
            # every (entry, head) pair, ordered by (row, head) and then by the entry's place
            key = (rows[:, None] * k + heads).reshape(-1)
            pick = torch.sort(key, stable=True).indices
            entry, head = pick // k, pick % k
            flat = entries[entry] * k + head
            return indptr(key, n_rows * k), cols[entry] * k + head, flat

        entries = torch.arange(adj.col.numel())
        crow, col, take = expand(adj.row, adj.col, entries, adj.n_dst)
        t_crow_k, t_col_k, take_t = expand(t_row, t_col, t_entry, adj.n_src)
        a, t = _narrow(crow, col, max(shape)), _narrow(t_crow_k, t_col_k, max(shape))
        return cls(*a, take, *t, take_t, shape)

    def matrix(self, alpha: torch.Tensor) -> torch.Tensor:
        values = alpha.reshape(-1)
        if self.take is not None:
            values = values.index_select(0, self.take)
        return _csr(self.crow, self.col, values, self.shape)

    def transposed(self, alpha: torch.Tensor) -> torch.Tensor:
        values = alpha.reshape(-1).index_select(0, self.take_t)
        return _csr(self.t_crow, self.t_col, values, self.shape[::-1])


def _narrow(crow: torch.Tensor, col: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 CSR indices where they fit: MKL's product takes them as they are (int64 ones are
    converted on every call: 220 -> 158 us for Cora's 106K-entry product, one thread)."""
    if max(n, crow.numel(), int(crow[-1]) if crow.numel() else 0) < 2**31:
        return crow.to(torch.int32), col.to(torch.int32)
    return crow, col


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class _EdgeWeightedSum(torch.autograd.Function):
    """``out[i, h] = sum_e alpha[e, h] x[col[e], h]`` over row ``i``'s entries, every head in
    one CSR product (:class:`HeadsCSR`); the transposed product for ``x``'s gradient and
    ``<grad[i, h], x[j, h]>`` per entry for ``alpha``'s. bf16
    and fp16 are computed in fp32 (CPU has no bf16 CSR product), fp64 in fp64."""

    @staticmethod
    def forward(ctx, alpha: torch.Tensor, x: torch.Tensor, adj: AttentionCSR) -> torch.Tensor:
        n_src, k, c = x.shape
        ctx.adj, ctx.dtype = adj, x.dtype
        wide = _wide(x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            alpha, x = alpha.to(wide), x.to(wide).contiguous()
            ctx.save_for_backward(alpha, x)
            out = gat_kernel.csr_mm(adj.heads(k).matrix(alpha), x.view(n_src * k, c))
        return out.view(adj.n_dst, k, c).to(ctx.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        alpha, x = ctx.saved_tensors
        n_src, k, c = x.shape
        adj = ctx.adj
        grad_alpha = grad_x = None
        with torch.autocast(grad.device.type, enabled=False):
            grad = grad.to(x.dtype).contiguous().view(-1, c)
            if ctx.needs_input_grad[0] and k == 1:  # <grad[row], x[col]> per entry
                csr = adj.heads(1)
                grad_alpha = torch.sparse.sampled_addmm(
                    csr.matrix(alpha), grad, x.view(n_src, c).t(), beta=0.0
                ).values()
                grad_alpha = grad_alpha.view_as(alpha)
            elif ctx.needs_input_grad[0]:
                # several heads: gathered rows, multiplied, summed over the channels. On one
                # Intel Xeon thread, Cora's 13K entries x 8 heads x 8 channels: 1.1 ms, against
                # 2.8 ms for sampled_addmm on the block-diagonal matrix; one head of a gat3
                # layer (250K entries x 16 channels): 9.5 ms, against 1.8 ms for sampled_addmm.
                g = grad.view(adj.n_dst, k, c)
                if _fused_products(g, x, adj):  # the same products, in one parallel pass
                    g = gat_kernel.edge_products(g, x, adj.crow, adj.col)
                else:
                    g = g.index_select(0, adj.row).mul_(x.index_select(0, adj.col))
                grad_alpha = g.sum(-1)
            if ctx.needs_input_grad[1]:
                grad_x = gat_kernel.csr_mm(adj.heads(k).transposed(alpha), grad)
                grad_x = grad_x.view(n_src, k, c).to(ctx.dtype)
        return grad_alpha, grad_x, None


def _attention_dropout(alpha: torch.Tensor, p: float, training: bool, adj: AttentionCSR):
    """:func:`dropout` of the attention weights; on a whole graph the mask is drawn in PyG's
    entry order (``adj.order``), so the same seed drops the same edges as GATConv does."""
    if adj.order is None or not training or p == 0.0 or alpha.device.type != "cpu":
        return dropout(alpha, p, training)
    return alpha * factors(alpha.shape, p, alpha.dtype).index_select(0, adj.order)


def _attention_keep(alpha_shape, p: float, training: bool, adj: AttentionCSR):
    """The attention-dropout factors (0 or 1/(1-p)) in ``adj``'s entry order, drawn as
    :func:`_attention_dropout` draws them (None: no dropout)."""
    if not training or p == 0.0:
        return None
    keep = factors(alpha_shape, p)
    return keep if adj.order is None else keep.index_select(0, adj.order)


class _EdgeSoftmax(torch.autograd.Function):
    """``softmax(leaky_relu(a_src[col] + a_dst[row]))`` over each row's entries, times the
    attention-dropout factors ``keep``: :func:`attention`'s torch operations fused into
    parallel passes over the rows (``gat_kernel.c``), with the same float operations in the
    same order, so the same values to the bit, forward and backward
    (tests/models/test_gat_full_csr.py)."""

    @staticmethod
    def forward(ctx, a_src, a_dst, keep, adj: AttentionCSR, slope: float):
        a_src, a_dst = a_src.contiguous(), a_dst.contiguous()
        out, s, ex, total = gat_kernel.softmax_forward(a_src, a_dst, keep, adj.crow, adj.col, slope)
        ctx.adj, ctx.slope, ctx.n_src = adj, slope, a_src.size(0)
        ctx.save_for_backward(s, ex, total, keep)
        return out

    @staticmethod
    def backward(ctx, grad):
        s, ex, total, keep = ctx.saved_tensors
        t_crow, t_entry = ctx.adj.by_source()
        grad_src, grad_dst = gat_kernel.softmax_backward(
            grad.contiguous(),
            keep,
            s,
            ex,
            total,
            ctx.adj.crow,
            t_crow,
            t_entry,
            ctx.n_src,
            ctx.slope,
        )
        return grad_src, grad_dst, None, None, None


def _fused(a_src: torch.Tensor, a_dst: torch.Tensor, adj: AttentionCSR) -> bool:
    """Whether :class:`_EdgeSoftmax` takes this layer: float32 on CPU, int64 indices, and the
    compiled kernel built (``FUSED_SOFTMAX``: off, the torch operations, for comparisons)."""
    return (
        FUSED_SOFTMAX
        and a_src.device.type == "cpu"
        and a_src.dtype == torch.float32
        and a_dst.dtype == torch.float32
        and adj.col.dtype == torch.int64
        and adj.crow.dtype == torch.int64
        and gat_kernel.available()
    )


def _fused_products(g: torch.Tensor, x: torch.Tensor, adj: AttentionCSR) -> bool:
    return (
        FUSED_SOFTMAX
        and g.device.type == "cpu"
        and g.dtype == torch.float32
        and x.dtype == torch.float32
        and g.is_contiguous()
        and x.is_contiguous()
        and adj.col.dtype == torch.int64
        and adj.crow.dtype == torch.int64
        and gat_kernel.available()
    )


def attention(conv: GATConv, x: torch.Tensor, adj: AttentionCSR) -> torch.Tensor:
    """``conv(x, edge_index)[:n_dst]`` for a GATConv without edge features: the same function
    of the same parameters, computed for ``adj``'s destination rows over its CSR (the softmax
    over each row's entries fused in :class:`_EdgeSoftmax` where the compiled kernel is built,
    else segment max/sum; one CSR product for the weighted sum)."""
    heads, c = conv.heads, conv.out_channels
    h = conv.lin(x).view(-1, heads, c)
    a_src = (h * conv.att_src).sum(-1)
    a_dst = (h[: adj.n_dst] * conv.att_dst).sum(-1)
    if _fused(a_src, a_dst, adj):
        keep = _attention_keep((adj.col.numel(), heads), conv.dropout, conv.training, adj)
        alpha = _EdgeSoftmax.apply(a_src, a_dst, keep, adj, float(conv.negative_slope))
        out = _EdgeWeightedSum.apply(alpha, h, adj)
        out = out.reshape(-1, heads * c) if conv.concat else out.mean(dim=1)
        return out if conv.bias is None else out + conv.bias
    e = a_src.index_select(0, adj.col) + a_dst.index_select(0, adj.row)
    e = F.leaky_relu(e, conv.negative_slope)
    top = torch.segment_reduce(e.detach(), "max", offsets=adj.crow, axis=0)
    e = (e - top.index_select(0, adj.row)).exp()
    total = torch.segment_reduce(e, "sum", offsets=adj.crow, axis=0) + 1e-16
    alpha = _attention_dropout(e / total.index_select(0, adj.row), conv.dropout, conv.training, adj)
    out = _EdgeWeightedSum.apply(alpha, h, adj)
    out = out.reshape(-1, heads * c) if conv.concat else out.mean(dim=1)
    return out if conv.bias is None else out + conv.bias


def attention_layer(conv: GATConv, x: torch.Tensor, layer: HopLayer) -> torch.Tensor:
    """:func:`attention` on a neighbour-sampled layer's edges."""
    return attention(conv, x, AttentionCSR.of(layer))


class GraphCSRs(TensorKeyedCache):
    """The :class:`AttentionCSR` of each whole graph seen recently (``capacity`` of them),
    keyed on the edge tensor (:class:`TensorKeyedCache`) and the node count, so a new or
    modified ``edge_index`` is converted again."""

    def __init__(self, capacity: int = 8) -> None:
        super().__init__(capacity)

    def get(self, edge_index: torch.Tensor, n: int) -> AttentionCSR:
        return self._cached(edge_index, n, lambda: AttentionCSR.of_graph(edge_index, n))


class GATBlock(nn.Module):
    """``dropout -> GATConv -> ELU`` (no ELU on the last block).

    ``sparse_input=True`` (the first block) moves the input dropout into
    :class:`SparseInputLinear`, GATConv's projection, so a sparse input stays sparse.

    On a neighbour-sampled batch's layer (:class:`~gnnpar.models.hops.HopLayer`) the block
    runs on the layer's edges only (PyG's ``trim_to_layer``) and returns its ``n_dst`` rows:
    each of those aggregates all its sampled edges and its self-loop, as on the whole batch.
    """

    trims = True  # runs on a HopLayer (see gnnpar.models.base.BlockModel.forward)
    csr = True  # a HopLayer through attention_layer (False: PyG's GATConv, then its rows)

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        heads: int,
        concat: bool,
        dropout: float,
        last: bool,
        sparse_input: bool = False,
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.last = last
        self.sparse_input = sparse_input
        self.conv = FastDropoutGATConv(in_dim, out_dim, heads=heads, concat=concat, dropout=dropout)
        self.graphs = GraphCSRs()  # whole graphs' CSRs, kept across steps
        if sparse_input:
            lin = SparseInputLinear(in_dim, heads * out_dim, dropout)
            lin.weight = self.conv.lin.weight  # keep GATConv's own initialisation
            self.conv.lin = lin

    def forward(self, x: torch.Tensor, edge_index) -> torch.Tensor:
        if not self.sparse_input:
            x = dropout(x, self.dropout, self.training)
        if isinstance(edge_index, HopLayer):
            if self.csr:
                x = attention_layer(self.conv, x, edge_index)
            else:
                x = self.conv(x, edge_index.edge_index)[: edge_index.n_dst]
        elif self.csr and isinstance(edge_index, torch.Tensor) and x.device.type == "cpu":
            x = attention(self.conv, x, self.graphs.get(edge_index, x.size(0)))
        else:
            x = self.conv(x, edge_index)
        return x if self.last else F.elu(x)


def build_gat(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    """``layers - 1`` concatenating hidden blocks, then an output block averaging its heads."""
    h, heads, p = mcfg.hidden, mcfg.heads, mcfg.dropout
    blocks: list[nn.Module] = []
    dim = in_dim
    for i in range(mcfg.layers - 1):
        blocks.append(GATBlock(dim, h, heads, True, p, last=False, sparse_input=i == 0))
        dim = h * heads
    # Output layer: study 001 averages its 8 heads (concat=False); gat3 has a single head.
    blocks.append(
        GATBlock(dim, num_classes, heads, False, p, last=True, sparse_input=mcfg.layers == 1)
    )
    return BlockModel(blocks, head=output_head(multilabel))


def build_gat3(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    """Study 002's GAT: the same blocks; config.resolve sets 3 layers x 16 hidden, 1 head."""
    return build_gat(mcfg, in_dim, num_classes, multilabel)
