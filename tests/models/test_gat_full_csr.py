"""Full-batch GAT over a CSR (models/gat.py, ``attention`` with ``AttentionCSR.of_graph``)
computes PyG GATConv's function: outputs, every gradient, and with attention dropout the same
dropped edges for the same seed (the mask is drawn in PyG's entry order)."""

from __future__ import annotations

import pytest
import torch

from gnnpar.models import gat, gat_kernel
from gnnpar.models.gat import AttentionCSR, GATBlock, GraphCSRs
from gnnpar.models.hops import HopLayer


def _graph(seed: int = 3, n: int = 40, e: int = 300):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n - 1, (e,), generator=g)  # node n - 1: no edges at all
    dst = torch.randint(0, n - 1, (e,), generator=g)
    src[:5] = dst[:5]  # self-loops, which GATConv removes before adding its own
    return torch.stack([src, dst]), n  # unsorted, repeated edges


def _run(blocks, x, edge_index, csr: bool, train: bool, seed: int = 1):
    for b in blocks:
        b.csr = csr
        b.train(train)
        b.zero_grad()
    xi = x.clone().requires_grad_()
    torch.manual_seed(seed)
    out = xi
    for b in blocks:
        out = b(out, edge_index)
    w = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * w).sum().backward()
    return out.detach(), xi.grad, [p.grad.clone() for b in blocks for p in b.parameters()]


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("heads", [1, 3])
def test_full_graph_attention_equals_pyg_gatconv(heads: int, train: bool):
    edge_index, n = _graph()
    torch.manual_seed(0)
    blocks = [
        GATBlock(12, 4, heads, True, 0.5, last=False),
        GATBlock(4 * heads, 5, heads, False, 0.5, last=True),
    ]
    x = torch.randn(n, 12, generator=torch.Generator().manual_seed(7))
    ref, ref_gx, ref_gp = _run(blocks, x, edge_index, csr=False, train=train)
    got, got_gx, got_gp = _run(blocks, x, edge_index, csr=True, train=train)
    # dropout drew the same masks: a different mask would move outputs by O(1), not rounding
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_gx, ref_gx, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_gp, ref_gp):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_full_graph_attention_float64_agrees_to_rounding():
    """In float64 the two summation orders agree to ~1e-15: the functions are the same."""
    edge_index, n = _graph(seed=4)
    torch.manual_seed(0)
    blocks = [GATBlock(6, 3, 2, True, 0.0, last=False).double()]
    x = torch.randn(n, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ref, ref_gx, ref_gp = _run(blocks, x, edge_index, csr=False, train=True)
    got, got_gx, got_gp = _run(blocks, x, edge_index, csr=True, train=True)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(got_gx, ref_gx, rtol=1e-12, atol=1e-13)
    for a, b in zip(got_gp, ref_gp):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_graph_csr_keeps_pygs_order_within_rows_and_for_the_mask():
    # edges (src -> dst): 2->0, 0->1, 1->0, 1->1 (a loop, removed), 0->2; then 3 loops
    edge_index = torch.tensor([[2, 0, 1, 1, 0], [0, 1, 0, 1, 2]])
    adj = AttentionCSR.of_graph(edge_index, 3)
    assert adj.crow.tolist() == [0, 3, 5, 7]
    assert adj.col.tolist() == [2, 1, 0, 0, 1, 0, 2]  # row 0: 2->0, 1->0, then its loop
    assert adj.row.tolist() == [0, 0, 0, 1, 1, 2, 2]
    # PyG's entries: 2->0, 0->1, 1->0, 0->2 (kept edges), then loops 0, 1, 2
    assert adj.order.tolist() == [0, 2, 4, 1, 5, 3, 6]


def test_heads_csr_is_block_diagonal_per_head():
    edge_index, n = _graph(seed=9, n=12, e=40)
    adj = AttentionCSR.of_graph(edge_index, n)
    k, c = 3, 2
    alpha = torch.rand(adj.col.numel(), k)
    x = torch.randn(n, k, c)
    got = torch.sparse.mm(adj.heads(k).matrix(alpha), x.view(n * k, c)).view(n, k, c)
    got_t = torch.sparse.mm(adj.heads(k).transposed(alpha), x.view(n * k, c)).view(n, k, c)
    for h in range(k):
        a = adj.matrix(alpha[:, h].contiguous()).to_dense()
        torch.testing.assert_close(got[:, h], a @ x[:, h])
        torch.testing.assert_close(got_t[:, h], a.t() @ x[:, h])


def test_graph_csrs_cache_sees_a_new_or_changed_edge_index():
    cache = GraphCSRs(capacity=2)
    edge_index, n = _graph()
    first = cache.get(edge_index, n)
    assert cache.get(edge_index, n) is first
    assert cache.get(edge_index, n + 1) is not first  # another node count
    edge_index[0, 0] = (edge_index[0, 0] + 1) % n  # in place: the version counter moves
    changed = cache.get(edge_index, n)
    assert changed is not first
    other = edge_index.clone()
    assert cache.get(other, n) is not changed


# ------------------------------------------------------- the fused edge softmax (gat_kernel.c)
needs_kernel = pytest.mark.skipif(
    not gat_kernel.available(), reason="gnnpar.models._gat_kernel not built (no C compiler)"
)


def _fused_and_torch(monkeypatch, blocks, x, edge_index, train: bool):
    monkeypatch.setattr(gat, "FUSED_SOFTMAX", False)
    ref = _run(blocks, x, edge_index, csr=True, train=train)
    monkeypatch.setattr(gat, "FUSED_SOFTMAX", True)
    got = _run(blocks, x, edge_index, csr=True, train=train)
    return got, ref


def _assert_bits_equal(got, ref):
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert all(torch.equal(a, b) for a, b in zip(got[2], ref[2]))


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("heads", [1, 3, 8])
def test_fused_edge_softmax_equals_torch_ops_to_the_bit(monkeypatch, heads, train, threads):
    """The kernel does torch's float operations in torch's order: the same outputs and
    gradients, bit for bit, with attention dropout (the same draws) and without; graphs large
    enough for the kernel's parallel loops (PARALLEL_MIN) with 2 threads."""
    edge_index, n = _graph(n=700, e=6000)
    torch.manual_seed(0)
    blocks = [
        GATBlock(12, 4, heads, True, 0.5, last=False),
        GATBlock(4 * heads, 7, heads, False, 0.5, last=True),
    ]
    x = torch.randn(n, 12, generator=torch.Generator().manual_seed(7))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got, ref = _fused_and_torch(monkeypatch, blocks, x, edge_index, train)
    finally:
        torch.set_num_threads(before)
    _assert_bits_equal(got, ref)
    assert got[0].abs().sum() > 0 and all(g.abs().sum() > 0 for g in got[2])


@needs_kernel
def test_fused_edge_softmax_on_a_sampled_layer_equals_torch_ops(monkeypatch):
    """A neighbour-sampled layer (``AttentionCSR.of``, its own dropout order) the same way."""
    torch.manual_seed(0)
    n_src, n_dst, e = 500, 120, 3000
    g = torch.Generator().manual_seed(5)
    dst = torch.sort(torch.randint(0, n_dst, (e,), generator=g)).values
    src = torch.randint(0, n_src, (e,), generator=g)
    layer = HopLayer(torch.stack([src, dst]), n_src, n_dst)
    blocks = [GATBlock(10, 6, 2, True, 0.5, last=False)]
    x = torch.randn(n_src, 10, generator=torch.Generator().manual_seed(1))
    got, ref = _fused_and_torch(monkeypatch, blocks, x, layer, train=True)
    _assert_bits_equal(got, ref)


@needs_kernel
def test_gat_kernel_shares_torchs_openmp_threads():
    """Loaded after torch, the kernel's libgomp is torch's: torch's thread count is its own."""
    lib = gat_kernel.load()
    before = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            assert lib.gnnpar_gat_max_threads() == t
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("e", "n"), [(0, 5), (1, 1), (40, 3), (245_000, 23_194)])
def test_order_by_key_is_torchs_stable_sort_and_the_keys_offsets(e, n, monkeypatch):
    """The transpose's order by counting (kernel) equals torch's stable sort, and so does the
    fallback without the kernel; ptr is each key's offsets."""
    from gnnpar.csr import indptr
    from gnnpar.models import gat_kernel

    key = torch.randint(0, n, (e,), generator=torch.Generator().manual_seed(e))
    want = torch.sort(key, stable=True).indices
    ptr, order = gat_kernel.order_by_key(key, n)
    assert torch.equal(order, want) and torch.equal(ptr, indptr(key, n))
    monkeypatch.setattr(gat_kernel, "load", lambda: None)
    ptr, order = gat_kernel.order_by_key(key, n)
    assert torch.equal(order, want) and torch.equal(ptr, indptr(key, n))


def test_order_by_key_refuses_keys_outside_the_range():
    from gnnpar.models import gat_kernel

    for bad in ([0, 3], [-1, 0]):
        with pytest.raises(ValueError, match="not in \\[0, 3\\)"):
            gat_kernel.order_by_key(torch.tensor(bad), 3)
