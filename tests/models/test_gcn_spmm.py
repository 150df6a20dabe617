"""GCN's CSR propagation (models/gcn.py) against PyG's GCNConv: the same outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import GCNConv

from gnnpar.models.gcn import GCNAdjacencyCache, GCNBlock, normalised_adjacency


def _graph(n: int = 30, e: int = 120, seed: int = 0) -> torch.Tensor:
    """Random directed edges with repeated edges, self-loops and isolated nodes among them."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n - 3, (2, e), generator=g)  # the last 3 nodes have no edges
    ei = torch.cat([ei, ei[:, :10], torch.tensor([[0, 5], [0, 5]])], 1)  # repeats, self-loops
    return ei


def _pair(in_dim: int, out_dim: int, last: bool, sparse_input: bool = False):
    torch.manual_seed(1)
    block = GCNBlock(in_dim, out_dim, 0.0, last=last, sparse_input=sparse_input)
    ref = GCNConv(in_dim, out_dim, cached=False)
    ref.lin.weight.data.copy_(block.conv.lin.weight)
    ref.bias.data.copy_(block.conv.bias)
    return block, ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_matches_pyg_gcnconv_forward_and_backward(dtype):
    ei = _graph()
    block, ref = _pair(8, 5, last=True)
    block.to(dtype), ref.to(dtype)
    x = torch.randn(30, 8, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, want = block(x, ei), ref(x_ref, ei)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, want, **tol)
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad, **tol)
    torch.testing.assert_close(block.conv.lin.weight.grad, ref.lin.weight.grad, **tol)
    torch.testing.assert_close(block.conv.bias.grad, ref.bias.grad, **tol)


def test_sparse_input_block_and_relu_match():
    """The first block (SparseInputLinear projection) on a mostly-zero input, ReLU after."""
    ei = _graph(seed=3)
    block, ref = _pair(40, 6, last=False, sparse_input=True)
    x = torch.zeros(30, 40)
    x[torch.arange(30), torch.arange(30) % 40] = 1.0  # one non-zero per row
    torch.testing.assert_close(block(x, ei), torch.relu(ref(x, ei)), rtol=1e-5, atol=1e-6)


def test_adjacency_is_gcn_norm_and_transpose():
    ei = _graph(n=12, e=40, seed=2)
    a, at = normalised_adjacency(ei, 12, torch.float64)
    dense = torch.zeros(12, 12, dtype=torch.float64)
    loops = torch.arange(12)
    full = torch.cat([ei[:, ei[0] != ei[1]], torch.stack([loops, loops])], 1)
    dense.index_put_((full[1], full[0]), torch.ones(full.size(1), dtype=torch.float64), True)
    d = dense.sum(1).pow(-0.5)  # in-degree with one self-loop per node
    torch.testing.assert_close(a.to_dense(), d[:, None] * dense * d[None, :])
    torch.testing.assert_close(at.to_dense(), a.to_dense().t())


def test_cache_reuses_and_never_mistakes_a_changed_graph():
    cache = GCNAdjacencyCache(max_edges=10_000)
    ei = _graph()
    a1, _ = cache.get(ei, 30, torch.float32, False, True)
    a2, _ = cache.get(ei, 30, torch.float32, False, True)
    assert a2 is a1  # the same graph again: kept
    assert cache.get(ei.view(2, -1), 30, torch.float32, False, True)[0] is a1  # another object
    # over the same memory: confirmed by its contents
    ei[0, 0] = (ei[0, 0] + 1) % 27  # changed in place, same address and shape
    a3, _ = cache.get(ei, 30, torch.float32, False, True)
    assert a3 is not a1
    torch.testing.assert_close(
        a3.to_dense(), normalised_adjacency(ei, 30, torch.float32)[0].to_dense()
    )
    assert cache.get(ei, 31, torch.float32, False, True)[0].shape == (31, 31)  # other node count


def test_cache_stays_within_its_edge_budget():
    cache = GCNAdjacencyCache(max_edges=300)
    graphs = [_graph(seed=s) for s in range(5)]  # 132 edges each
    for ei in graphs:
        cache.get(ei, 30, torch.float32, False, True)
    assert cache.edges <= 300 and len(cache.entries) == 2
    big = torch.randint(0, 30, (2, 400))
    cache.get(big, 30, torch.float32, False, True)  # above the budget: built, not kept
    assert cache.edges <= 300 and all(e[0].size(1) != 400 for e in cache.entries.values())


def test_a_sparse_adjacency_takes_pygs_path():
    """Full-graph evaluation hands the blocks a CSR ``adj_t``: PyG's own propagation runs."""
    ei = _graph()
    block, ref = _pair(8, 5, last=True)
    x = torch.randn(30, 8)
    keep = ei[0] != ei[1]
    n, key = 30, torch.unique(ei[1, keep] * 30 + ei[0, keep], return_counts=True)
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(torch.bincount(key[0] // n, minlength=n), 0)
    adj_t = torch.sparse_csr_tensor(crow, key[0] % n, key[1].float(), (n, n))
    with torch.no_grad():
        torch.testing.assert_close(block(x, adj_t), ref(x, ei), rtol=1e-5, atol=1e-6)
