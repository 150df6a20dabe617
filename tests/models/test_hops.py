"""Per-layer trimming of sampled batches (models/hops.py): the trimmed forward gives the seeds
the outputs, loss and gradients of the forward on the whole sampled subgraph, for the built-in
sage and gat3 blocks, with either sampler backend; and the CSR mean equals PyG's mean."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import scatter

from gnnpar.config.schema import ModelConfig
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
from gnnpar.models import BlockModel, build_model
from gnnpar.models.hops import HopGraph, HopLayer, MeanAdjacency, mean_aggregate
from gnnpar.models.sage import SAGEBlock


def random_graph(n: int = 300, e: int = 2400, features: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    x = torch.randn(n, features, generator=g)
    return x, edge_index


def sampled_batch(backend: str, fanouts=(5, 3, 3), seeds: int = 16, isolated: bool = False):
    x, edge_index = random_graph()
    n = x.size(0)
    if isolated:  # node 0 has no in-neighbours: its mean is empty (PyG: lin_l(0) = bias)
        edge_index = edge_index[:, edge_index[1] != 0]
    sampler = NeighborSampler(
        CSRGraph.from_edge_index(edge_index, n), list(fanouts), backend=backend
    )
    seed_ids = torch.arange(seeds) * 7 % n
    b = sampler.sample(seed_ids, torch.Generator().manual_seed(3))
    return x[b.n_id], b


def model_of(name: str, in_dim: int, hidden: int, dropout: float, layers: int = 3) -> BlockModel:
    cfg = ModelConfig(name=name, hidden=hidden, layers=layers, heads=1, dropout=dropout)
    torch.manual_seed(0)
    return build_model(cfg, in_dim, 5, False)


def both_ways(model, x, b, grad_x: bool = False):
    """(seed outputs, parameter grads, input grad) untrimmed and trimmed, same parameters."""
    out = []
    for graph in (b.edge_index, HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)):
        model.zero_grad()
        xi = x.clone().requires_grad_(grad_x)
        y = model(xi, graph)[: b.batch_size]
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        out.append((y.detach(), grads, xi.grad))
    return out


@pytest.mark.parametrize("backend", ["kernel", "torch"])
@pytest.mark.parametrize("name,hidden", [("sage", 32), ("sage", 8), ("gat3", 16)])
@pytest.mark.parametrize("train", [False, True])
def test_trimmed_forward_equals_untrimmed_on_seed_rows(backend, name, hidden, train):
    """Eval mode, and train mode without dropout (a trimmed layer draws dropout for fewer rows,
    so with dropout > 0 the draws differ; their distribution does not). hidden 8 < 24 inputs
    and a gradient wanted for x: sage's hidden layers project before aggregating."""
    x, b = sampled_batch(backend)
    model = model_of(name, x.size(1), hidden, dropout=0.0 if train else 0.5)
    model.train(train)
    (full, g_full, xg_full), (trim, g_trim, xg_trim) = both_ways(model, x, b, grad_x=train)
    assert trim.shape == (b.batch_size, 5)
    torch.testing.assert_close(trim, full, rtol=1e-4, atol=1e-5)
    for a, c in zip(g_trim, g_full):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)
    if train:
        torch.testing.assert_close(xg_trim, xg_full, rtol=1e-4, atol=1e-5)


def test_trimming_computes_fewer_rows_and_edges():
    x, b = sampled_batch("kernel")
    hops = HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
    layers = [hops.layer(i, 3) for i in range(3)]
    n = b.num_sampled_nodes
    assert [(la.n_src, la.n_dst) for la in layers] == [
        (sum(n), sum(n[:3])),
        (sum(n[:3]), sum(n[:2])),
        (sum(n[:2]), n[0]),
    ]
    assert [la.edge_index.size(1) for la in layers] == [
        sum(b.num_sampled_edges[:k]) for k in (3, 2, 1)
    ]
    for la in layers:  # every edge of a layer reads a source row and writes a destination row
        assert int(la.edge_index[0].max()) < la.n_src and int(la.edge_index[1].max()) < la.n_dst


def test_fewer_layers_than_hops_and_an_isolated_seed():
    """A 2-layer model on a 3-hop batch reads the first two hops; node 0 (a seed) has no
    in-neighbours, so its mean is empty and sage gives it lin_l's bias, as PyG does."""
    x, b = sampled_batch("kernel", isolated=True)
    assert b.n_id[0] == 0
    model = model_of("sage", x.size(1), 16, 0.5, layers=2).eval()
    (full, *_), (trim, *_) = both_ways(model, x, b)
    torch.testing.assert_close(trim, full, rtol=1e-4, atol=1e-5)


def test_a_block_that_does_not_trim_gets_the_whole_batch():
    class Plain(nn.Module):  # a user's block: (x, edge_index) -> x, no `trims`
        def __init__(self):
            super().__init__()
            self.conv = SAGEConv(24, 5)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    x, b = sampled_batch("kernel")
    torch.manual_seed(0)
    model = BlockModel([SAGEBlock(24, 24, 0.0, last=False), Plain()]).eval()
    hops = HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
    assert not model.trims(hops)
    out = model(x, hops)
    assert out.size(0) == x.size(0)  # every row: nothing was trimmed
    torch.testing.assert_close(out, model(x, b.edge_index))


@pytest.mark.parametrize("columns", [1, 7])
def test_mean_aggregate_equals_scatter_mean_forward_and_backward(columns):
    g = torch.Generator().manual_seed(1)
    n_src, n_dst, e = 40, 25, 150
    dst = torch.sort(torch.randint(0, n_dst - 3, (e,), generator=g)).values  # last 3: no edges
    src = torch.randint(0, n_src, (e,), generator=g)
    h = torch.randn(n_src, columns, generator=g, requires_grad=True)
    adj = MeanAdjacency.build(src, dst, n_src, n_dst)
    out = mean_aggregate(h, adj)
    ref = scatter(h[src], dst, 0, dim_size=n_dst, reduce="mean")
    torch.testing.assert_close(out, ref)
    w = torch.randn(n_dst, columns, generator=g)
    (gh,) = torch.autograd.grad((out * w).sum(), h)
    (gr,) = torch.autograd.grad((ref * w).sum(), h)
    torch.testing.assert_close(gh, gr)


def test_mean_aggregate_under_bf16_autocast_keeps_the_input_dtype():
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([0, 0, 1])
    h = torch.randn(3, 4).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mean_aggregate(h, MeanAdjacency.build(src, dst, 3, 2))
    assert out.dtype == torch.bfloat16
    out.sum().backward()
    assert h.grad.dtype == torch.bfloat16


def test_hop_graph_rejects_counts_that_do_not_match():
    ei = torch.tensor([[1, 2], [0, 0]])
    with pytest.raises(ValueError, match="one more node count"):
        HopGraph(ei, [1, 2], [1, 1])
    with pytest.raises(ValueError, match="edge_index has 2"):
        HopGraph(ei, [1, 2], [3])
    with pytest.raises(ValueError, match="sampled for 1 hops"):
        HopGraph(ei, [1, 2], [2]).layer(0, 2)
    assert isinstance(HopGraph(ei, [1, 2], [2]).layer(0, 1), HopLayer)


def test_seed_loss_gives_a_hop_graph_only_to_block_models_that_trim():
    """A model with its own forward (a user's module adapted into a BlockModel) gets the plain
    edge_index from seed_loss; the built-in sage gets the trimmed graph, same loss."""
    from gnnpar.training.losses import seed_loss

    x, b = sampled_batch("kernel")
    b.x, b.y = x, torch.zeros(b.batch_size, dtype=torch.long)
    data = b.to_data()
    model = model_of("sage", x.size(1), 16, 0.0).eval()
    seen = []

    class OwnForward(BlockModel):
        def forward(self, x, edge_index=None):
            seen.append(type(edge_index))
            return super().forward(x, edge_index)

    own = OwnForward(list(model.blocks), head=model.head)
    torch.testing.assert_close(
        seed_loss(own, data, False), seed_loss(model, data, False), rtol=1e-5, atol=1e-6
    )
    assert seen == [torch.Tensor]


@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (3, False)])
@pytest.mark.parametrize("train", [False, True])
def test_gat_attention_on_csr_equals_pyg_gatconv(heads, concat, train):
    """attention_layer (segment softmax + CSR products) computes PyG GATConv's function on a
    layer's destination rows: outputs and the gradients of every parameter and of the input,
    with self-loops among the edges (GATConv removes them) and a destination without edges.
    Train mode without attention dropout (its draws differ in number), eval mode with it."""
    from gnnpar.models.gat import FastDropoutGATConv, attention_layer

    g = torch.Generator().manual_seed(5)
    n_src, n_dst, e = 50, 30, 260
    dst = torch.sort(torch.randint(0, n_dst - 1, (e,), generator=g)).values  # last: no edges
    src = torch.randint(0, n_src, (e,), generator=g)
    src[:7] = dst[:7]  # self-loops
    layer = HopLayer(torch.stack([src, dst]), n_src, n_dst)
    torch.manual_seed(0)
    conv = FastDropoutGATConv(12, 4, heads=heads, concat=concat, dropout=0.0 if train else 0.6)
    conv.train(train)
    x = torch.randn(n_src, 12, generator=g)
    w = torch.randn(n_dst, heads * 4 if concat else 4, generator=g)
    results = []
    for fn in (
        lambda xi: conv(xi, layer.edge_index)[:n_dst],
        lambda xi: attention_layer(conv, xi, layer),
    ):
        conv.zero_grad()
        xi = x.clone().requires_grad_()
        out = fn(xi)
        (out * w).sum().backward()
        results.append((out.detach(), xi.grad, [p.grad.clone() for p in conv.parameters()]))
    (ref, ref_gx, ref_gp), (got, got_gx, got_gp) = results
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_gx, ref_gx, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_gp, ref_gp):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_gat_attention_csr_puts_each_rows_loop_after_its_edges():
    from gnnpar.models.gat import AttentionCSR

    src, dst = torch.tensor([3, 1, 2, 0, 4]), torch.tensor([0, 0, 1, 1, 3])
    adj = AttentionCSR.of(HopLayer(torch.stack([src, dst]), 5, 4))  # no self-loops
    assert adj.crow.tolist() == [0, 3, 6, 7, 9]
    assert adj.col.tolist() == [3, 1, 0, 2, 0, 1, 2, 4, 3]
    assert adj.row.tolist() == [0, 0, 0, 1, 1, 1, 2, 3, 3]
    loops = AttentionCSR.of(HopLayer(torch.tensor([[1, 0], [1, 1]]), 2, 2))  # 1 -> 1 removed
    assert loops.col.tolist() == [0, 0, 1] and loops.crow.tolist() == [0, 1, 3]


@pytest.mark.parametrize("hidden", [32, 8])  # aggregate first (wide -> narrow) and project first
def test_a_trimmed_sage_step_runs_under_bf16_autocast_close_to_fp32(hidden):
    """Under ``--precision bf16`` (CPU autocast) the trimmed layers' products mix bfloat16
    outputs with float32 weights: the step runs, its parameters' gradients stay float32, and
    the seeds' outputs are fp32's to bfloat16's precision."""
    from gnnpar.training.precision import autocast

    x, b = sampled_batch("torch")
    model = model_of("sage", x.size(1), hidden, 0.0).train()
    graph = HopGraph(b.edge_index, b.num_sampled_nodes, b.num_sampled_edges)
    want = model(x, graph)[: b.batch_size].detach()
    with autocast("bf16", "cpu"):
        y = model(x, graph)[: b.batch_size]
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32
    torch.testing.assert_close(y.float(), want, rtol=5e-2, atol=5e-2)
