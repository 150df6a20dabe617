"""Models on tiny hand-built graphs: shapes, the studies' architectures, and GAT's sparse path."""

from __future__ import annotations

import gc

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from gnnpar.config.schema import Config
from gnnpar.configure import resolve
from gnnpar.models import BlockModel, build_model
from gnnpar.models.dropout import dropout
from gnnpar.models.gat import (
    CSRPlan,
    FastDropoutGATConv,
    SparseFeatures,
    SparseInputLinear,
    _CSRMatmul,
)
from helpers import tiny_graph


def model_config(name: str, **overrides):
    cfg = Config()
    cfg.data.dataset = "cora"
    cfg.model.name = name
    for k, v in overrides.items():
        setattr(cfg.model, k, v)
    resolve(cfg)
    return cfg.model


def sparse_graph(features: int = 40) -> Data:
    """tiny_graph's edges with a 6 x 40 bag-of-words feature matrix, 7.5% non-zero."""
    g = tiny_graph()
    x = torch.zeros(6, features)
    for node, cols in enumerate([[0, 5], [1, 7, 9], [2, 30], [3, 11, 20], [4, 39], [6, 25, 33]]):
        x[node, cols] = torch.arange(1, len(cols) + 1, dtype=torch.float) / 4
    g.x = x
    return g


def run_blocks(model: BlockModel, x, edge_index):
    h = model.stem(x)
    for block in model.blocks:
        h = block(h, edge_index)
    return model.head(h)


@pytest.mark.parametrize("name,blocks", [("gcn", 2), ("gat", 2), ("gat3", 3), ("sage", 3)])
def test_graph_models_shapes_blocks_and_log_softmax(name, blocks):
    torch.manual_seed(0)
    g = tiny_graph()
    model = build_model(model_config(name), in_dim=4, num_classes=3)
    model.eval()
    out = model(g.x, g.edge_index)
    assert out.shape == (6, 3)
    assert len(model.blocks) == blocks
    torch.testing.assert_close(out.exp().sum(dim=1), torch.ones(6))
    # Cutting the model into its ordered blocks computes the same thing (what a pipeline does).
    torch.testing.assert_close(run_blocks(model, g.x, g.edge_index), out, rtol=0, atol=0)
    torch.testing.assert_close(model(g.x, g.edge_index), out, rtol=0, atol=0)  # eval: determinist


def test_multilabel_models_return_raw_logits():
    g = tiny_graph()
    model = build_model(model_config("gcn"), in_dim=4, num_classes=3, multilabel=True).eval()
    out = model(g.x, g.edge_index)
    assert not torch.allclose(out.exp().sum(dim=1), torch.ones(6))


def test_gat_is_study_001():
    """dropout .6 -> GATConv(8 heads x 8, concat) -> ELU -> dropout .6 -> GATConv(8 heads, mean)."""
    mcfg = model_config("gat")
    model = build_model(mcfg, in_dim=1433, num_classes=7)
    first, second = (b.conv for b in model.blocks)
    assert (first.heads, first.out_channels, first.concat) == (8, 8, True)
    assert (second.heads, second.out_channels, second.concat) == (8, 7, False)
    assert first.dropout == second.dropout == 0.6  # attention dropout
    assert [b.dropout for b in model.blocks] == [0.6, 0.6]  # feature dropout
    assert isinstance(first, GATConv) and isinstance(second, GATConv)
    # lin 1433x64, att_src 64, att_dst 64, bias 64 | lin 64x56, att 56 + 56, bias 7
    expected = 1433 * 64 + 3 * 64 + 64 * 56 + 2 * 56 + 7
    assert sum(p.numel() for p in model.parameters()) == expected == 95_607


def test_gat3_is_study_002_and_sage_gcn_layers():
    gat3 = build_model(model_config("gat3"), in_dim=4, num_classes=3)
    assert [(b.conv.heads, b.conv.out_channels) for b in gat3.blocks] == [(1, 16), (1, 16), (1, 3)]
    assert [b.dropout for b in gat3.blocks] == [0.6] * 3
    sage = build_model(model_config("sage"), in_dim=4, num_classes=3)
    assert all(isinstance(b.conv, SAGEConv) for b in sage.blocks)
    assert [b.conv.out_channels for b in sage.blocks] == [256, 256, 3]
    assert all(str(b.conv.aggr_module) == "MeanAggregation()" for b in sage.blocks)
    gcn = build_model(model_config("gcn"), in_dim=4, num_classes=3)
    assert all(isinstance(b.conv, GCNConv) for b in gcn.blocks)


def test_train_mode_dropout_is_random_and_eval_is_not():
    g = sparse_graph()
    torch.manual_seed(0)
    model = build_model(model_config("gat"), in_dim=40, num_classes=2)
    a, b = model(g.x, g.edge_index), model(g.x, g.edge_index)
    assert not torch.equal(a, b)
    model.eval()
    torch.testing.assert_close(model(g.x, g.edge_index), model(g.x, g.edge_index), rtol=0, atol=0)


# ------------------------------------------------------------------------------ sparse GAT path
def test_csr_plan_round_trip_and_transpose():
    x = sparse_graph().x
    plan = CSRPlan.from_dense(x)
    assert plan.values.numel() == int((x != 0).sum()) == 15
    torch.testing.assert_close(plan.matrix(plan.values).to_dense(), x, rtol=0, atol=0)
    torch.testing.assert_close(plan.transposed(plan.values).to_dense(), x.t(), rtol=0, atol=0)


def test_csr_matmul_gradient_matches_finite_differences():
    x = sparse_graph().x.double()
    plan = CSRPlan.from_dense(x)
    w = torch.randn(40, 5, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: _CSRMatmul.apply(plan.values, w, plan), (w,))
    torch.testing.assert_close(_CSRMatmul.apply(plan.values, w, plan), x @ w)


def dense_twin(model: BlockModel) -> BlockModel:
    """The same weights with the sparse path switched off (every input counts as dense)."""
    import copy

    twin = copy.deepcopy(model)
    twin.blocks[0].conv.lin.sparse.max_density = -1.0
    return twin


def test_sparse_gat_path_is_taken_and_equals_dense_path_in_eval():
    g = sparse_graph()
    torch.manual_seed(0)
    model = build_model(model_config("gat"), in_dim=40, num_classes=2).eval()
    lin = model.blocks[0].conv.lin
    assert isinstance(lin, SparseInputLinear)
    dense = dense_twin(model)
    out = model(g.x, g.edge_index)
    assert lin.sparse.get(g.x) is not None  # the CSR path was used
    assert dense.blocks[0].conv.lin.sparse.get(g.x) is None
    torch.testing.assert_close(out, dense(g.x, g.edge_index), rtol=1e-6, atol=1e-6)


def test_sparse_gat_gradients_equal_dense_gradients_without_dropout():
    g = sparse_graph()
    torch.manual_seed(0)
    model = build_model(model_config("gat", dropout=0.0), in_dim=40, num_classes=2)
    dense = dense_twin(model)
    for m in (model, dense):
        m(g.x, g.edge_index)[g.train_mask].sum().backward()
    for (name, p), q in zip(model.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_sparse_cache_notices_in_place_changes_and_new_tensors():
    g = sparse_graph()
    torch.manual_seed(0)
    model = build_model(model_config("gat"), in_dim=40, num_classes=2).eval()
    dense = dense_twin(model)
    model(g.x, g.edge_index)
    g.x[0, 1] = 2.0  # in place: bumps the version counter
    torch.testing.assert_close(model(g.x, g.edge_index), dense(g.x, g.edge_index))
    other = g.x.clone()
    other[5, 0] = 3.0
    torch.testing.assert_close(model(other, g.edge_index), dense(other, g.edge_index))


def test_sparse_cache_keeps_several_inputs_and_forgets_dead_ones():
    cache = SparseFeatures()
    a, b = sparse_graph().x, sparse_graph().x * 2
    plan_a, plan_b = cache.get(a), cache.get(b)
    assert cache.get(a) is plan_a and cache.get(b) is plan_b  # alternating inputs still hit
    torch.testing.assert_close(plan_b.values, 2 * plan_a.values)
    del b
    gc.collect()
    assert len(cache._entries) == 1


def test_dense_inputs_skip_the_sparse_path():
    g = tiny_graph()  # 4 features, all non-zero but one
    model = build_model(model_config("gat"), in_dim=4, num_classes=2)
    model(g.x, g.edge_index)
    assert model.blocks[0].conv.lin.sparse.get(g.x) is None


def test_sparse_dropout_has_dense_dropout_statistics():
    """Dropping only non-zeros: zeros stay zero, kept values scale by 1/(1-p), keep rate 1-p."""
    torch.manual_seed(0)
    x = torch.zeros(400, 500)
    x[::2, ::5] = torch.rand(200, 100) + 0.5  # 10% non-zero: 20,000 values
    plan = CSRPlan.from_dense(x)
    p = 0.6
    lin = SparseInputLinear(500, 3, dropout=p)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(3, 500))
    kept_fraction, dense_fraction = [], []
    for _ in range(5):
        values = dropout(plan.values, p, True)
        dropped = plan.matrix(values).to_dense()
        assert torch.all(dropped[x == 0] == 0)
        kept = dropped != 0
        torch.testing.assert_close(dropped[kept], x[kept] / (1 - p))
        kept_fraction.append(kept.sum().item() / plan.values.numel())
        dense = torch.nn.functional.dropout(x, p, True)
        dense_fraction.append((dense != 0).sum().item() / plan.values.numel())
    # 100,000 Bernoulli(0.4) draws each: standard error 0.0015; 5 sigma.
    assert abs(sum(kept_fraction) / 5 - (1 - p)) < 0.008
    assert abs(sum(dense_fraction) / 5 - (1 - p)) < 0.008
    # The layer uses exactly that dropout: with identity weights its output is the dropped x.
    torch.manual_seed(1)
    out = lin(x)
    torch.manual_seed(1)
    expected = plan.matrix(dropout(plan.values, p, True)).to_dense()[:, :3]
    torch.testing.assert_close(out, expected)


def test_fast_dropout_gatconv_equals_pyg_gatconv_in_eval():
    g = tiny_graph()
    torch.manual_seed(0)
    ours = FastDropoutGATConv(4, 3, heads=2, dropout=0.6).eval()
    ref = GATConv(4, 3, heads=2, dropout=0.6).eval()
    ref.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(g.x, g.edge_index), ref(g.x, g.edge_index), rtol=0, atol=0)
    # In training its attention dropout zeroes about p of the coefficients, like F.dropout.
    ours.train()
    torch.manual_seed(0)
    _, (_, alpha) = ours(torch.randn(300, 4), torch.randint(0, 300, (2, 3000)), None, None, True)
    assert abs((alpha == 0).float().mean().item() - 0.6) < 0.03


@pytest.mark.parametrize("threads", [1, 2])
def test_fast_dropout_gatconv_sums_like_pyg_bit_for_bit_with_gradients(threads):
    """The index_add_ aggregation adds in PyG's order at any thread count: outputs and every
    gradient equal stock GATConv's exactly (1000 edges onto 50 nodes, 8 heads)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 16, generator=g)
    edge_index = torch.randint(0, 50, (2, 1000), generator=g)
    torch.manual_seed(0)
    ours = FastDropoutGATConv(16, 8, heads=8, dropout=0.0)
    ref = GATConv(16, 8, heads=8, dropout=0.0)
    ref.load_state_dict(ours.state_dict())
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        outs = []
        for conv in (ours, ref):
            xi = x.clone().requires_grad_()
            out = conv(xi, edge_index)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            outs.append([out.detach(), xi.grad] + [p.grad for p in conv.parameters()])
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_sparse_gcn_first_block_equals_plain_gcnconv_outputs_and_gradients():
    """GCN's first block uses the CSR input path; without dropout it is PyG's GCNConv exactly."""
    g = sparse_graph()
    torch.manual_seed(0)
    model = build_model(model_config("gcn", dropout=0.0), in_dim=40, num_classes=2)
    block = model.blocks[0]
    assert isinstance(block.conv.lin, SparseInputLinear)
    plain = GCNConv(40, block.conv.out_channels)
    plain.lin.weight = torch.nn.Parameter(block.conv.lin.weight.detach().clone())
    plain.bias = torch.nn.Parameter(block.conv.bias.detach().clone())
    out = block(g.x, g.edge_index)
    assert block.conv.lin.sparse.get(g.x) is not None  # the CSR path was used
    ref = torch.relu(plain(g.x, g.edge_index))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(block.conv.lin.weight.grad, plain.lin.weight.grad)


def _same_plan(a: CSRPlan, b: CSRPlan) -> None:
    for name in ("crow", "col", "values", "t_crow", "t_col", "t_perm"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.shape == b.shape


def test_rows_of_a_plan_equal_the_plan_of_those_rows_entry_for_entry():
    gen = torch.Generator().manual_seed(3)
    whole = torch.rand(300, 50, generator=gen)
    whole[whole < 0.9] = 0.0  # ~10% non-zero
    whole[7] = 0.0  # an empty row
    plan = CSRPlan.from_dense(whole)
    for index in (
        torch.randint(0, 300, (120,), generator=gen),  # repeats, any order
        torch.tensor([7, 7, 0]),
        torch.arange(300).flip(0),
        torch.tensor([], dtype=torch.long),
    ):
        _same_plan(plan.rows(index), CSRPlan.from_dense(torch.index_select(whole, 0, index)))


def test_marked_rows_take_the_whole_matrix_plan_and_the_same_decision():
    """A sampled batch's features, marked as rows of the graph's (gnnpar.csr.mark_rows): the
    plan is gathered from the whole matrix's, equal to examining the batch, and the sparse or
    dense decision is the batch's own (a dense batch of a sparse matrix stays dense)."""
    from gnnpar.csr import mark_rows

    whole = torch.zeros(6000, 30)
    whole[::7, 3] = 1.0
    whole[:200, :10] = 2.0  # rows 0-199 are a third non-zero
    cache, fresh = SparseFeatures(), SparseFeatures()
    for index in (torch.arange(200, 6000, 3), torch.arange(0, 200), torch.arange(0, 6000)):
        x = torch.index_select(whole, 0, index)
        mark_rows(x, whole, index)
        gathered, examined = cache.get(x), fresh.get(x.clone())
        assert (gathered is None) == (examined is None)
        if examined is not None:
            _same_plan(gathered, examined)
    # the whole matrix's rows were made once and are kept for the next batch
    assert cache._cached(whole, "rows", lambda: None) is not None
    x = torch.index_select(whole, 0, torch.arange(200, 300))
    mark_rows(x, whole, torch.arange(200, 300))
    x[0, 0] = 5.0  # changed after marking: examined itself, not taken from the whole
    _same_plan(cache.get(x), CSRPlan.from_dense(x))


def test_sampled_batches_are_marked_as_rows_of_the_graphs_features():
    """The sampled source marks each batch's features; the plan the model gathers equals the
    one it would build from the batch."""
    from gnnpar.configure import build_config
    from gnnpar.csr import rows_origin
    from gnnpar.data.datasets import load_dataset
    from gnnpar.runtime.dist import DistContext
    from gnnpar.training.sources import SampledSource

    cfg = build_config(None, {"dataset": "cora", "model": "gcn", "strategy": "sampled"})
    ds = load_dataset("cora", cfg.data.data_root)
    train_idx = ds.data.train_mask.nonzero().view(-1)
    source = SampledSource(cfg, ds, DistContext(), train_idx)
    try:
        source.start()
        batch = next(source.epoch(0))
        whole, index = rows_origin(batch.x)
        assert whole is ds.data.x and torch.equal(index, batch.n_id)
        _same_plan(SparseFeatures().get(batch.x), CSRPlan.from_dense(batch.x.clone()))
    finally:
        source.close()


def test_sparse_features_probe_decides_only_clearly_dense_inputs():
    cache = SparseFeatures()
    dense = torch.randn(5000, 30)
    assert cache._surely_dense(dense) and cache.get(dense) is None
    sparse = torch.zeros(5000, 30)
    sparse[::7, 3] = 1.0  # 0.5% non-zero: counted in full, the CSR path
    assert not cache._surely_dense(sparse) and cache.get(sparse) is not None
    rows = torch.zeros(5000, 30)
    rows[:, :4] = 1.0  # 13%, every row alike: the probe is not conclusive, the count says dense
    assert not cache._surely_dense(rows) and cache.get(rows) is None
