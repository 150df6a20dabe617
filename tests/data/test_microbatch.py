"""Graph micro-batches (data/microbatch.py): exact plans cover, are disjoint, keep every needed
edge, and reproduce full-graph outputs, losses and gradients; index plans lose edges."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import to_undirected

from gnnpar import UsageError
from gnnpar.config.schema import ModelConfig
from gnnpar.data.microbatch import IGNORE, build_plan, receptive_hops
from gnnpar.models import build_model
from gnnpar.parallel.pipeline.stages import summed_loss
from helpers import tiny_graph


def random_graph(n: int = 80, e: int = 200, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = to_undirected(ei[:, ei[0] != ei[1]], num_nodes=n)
    x = torch.randn(n, 5, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return ei, x, y


def needed_edges(edge_index: torch.Tensor, target: int, hops: int) -> set[tuple[int, int]]:
    """Brute force: every edge on a path of <= hops edges that ends at target."""
    need, frontier = set(), {target}
    for _ in range(hops):
        nxt = set()
        for s, d in edge_index.t().tolist():
            if d in frontier:
                need.add((s, d))
                nxt.add(s)
        frontier = nxt
    return need


def test_tiny_graph_exact_plan_by_hand():
    g = tiny_graph()  # triangles 0-1-2 and 3-4-5 joined by 2-3
    plan = build_plan(g.edge_index, 6, torch.tensor([0, 5]), chunks=2, hops=1)
    assert sorted(sorted(b.nodes.tolist()) for b in plan.batches) == [[0, 1, 2], [3, 4, 5]]
    plan2 = build_plan(g.edge_index, 6, torch.tensor([0, 5]), chunks=2, hops=2)
    assert sorted(sorted(b.nodes.tolist()) for b in plan2.batches) == [[0, 1, 2, 3], [2, 3, 4, 5]]
    assert plan2.size == 4 and plan2.nodes_computed == 8
    assert plan2.halo_overhead == pytest.approx(8 / 6)


@pytest.mark.parametrize("chunks", [1, 3, 4])
def test_exact_targets_disjoint_cover_and_edges(chunks):
    ei, _, _ = random_graph()
    targets = torch.arange(0, 80, 2)
    plan = build_plan(ei, 80, targets, chunks, hops=2)
    got = torch.cat([b.out_nodes for b in plan.batches])
    assert sorted(got.tolist()) == targets.tolist()  # union = targets, no duplicates
    assert plan.chunks == chunks
    for b in plan.batches:
        assert torch.equal(b.nodes[b.out_pos], b.out_nodes)
        have = {(int(b.nodes[s]), int(b.nodes[d])) for s, d in b.edge_index.t().tolist()}
        for t in b.out_nodes.tolist():
            assert needed_edges(ei, t, 2) <= have


@pytest.mark.parametrize("name", ["gat", "gcn", "sage"])
def test_exact_padded_outputs_equal_full_graph(name):
    ei, x, y = random_graph()
    torch.manual_seed(0)
    mcfg = ModelConfig(name=name, hidden=8, layers=2, heads=2, dropout=0.0)
    model = build_model(mcfg, 5, 3).eval()
    full = model(x, ei)
    plan = build_plan(ei, 80, torch.arange(80), 3, receptive_hops(name, 2))
    xs = plan.features(x)
    assert xs.size(0) == 3 * plan.size
    outs = []
    for i, b in enumerate(plan.batches):
        # padding rows are isolated zero rows: real rows must match the full graph exactly
        out = model(xs[i * plan.size : (i + 1) * plan.size], b.edge_index)
        outs.append(out)
        torch.testing.assert_close(out[b.out_pos], full[b.out_nodes], atol=1e-5, rtol=1e-5)
    ids, rows = plan.gather(torch.cat(outs))
    torch.testing.assert_close(rows, full[ids], atol=1e-5, rtol=1e-5)


def test_gcn_needs_one_more_hop_for_degrees():
    """With only L hops, GCN's normalisation reads truncated degrees of the outer halo."""
    ei, x, _ = random_graph(seed=3)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gcn", hidden=8, layers=2, dropout=0.0), 5, 3).eval()
    full = model(x, ei)
    plan = build_plan(ei, 80, torch.arange(80), 4, hops=2)
    xs = plan.features(x)
    diffs = [
        (
            model(xs[i * plan.size : (i + 1) * plan.size], b.edge_index)[b.out_pos]
            - full[b.out_nodes]
        )
        .abs()
        .max()
        for i, b in enumerate(plan.batches)
    ]
    assert max(diffs) > 1e-4


@pytest.mark.parametrize("chunks", [2, 4])
def test_sum_of_microbatch_losses_and_grads_equals_full_batch(chunks):
    ei, x, y = random_graph(seed=1)
    train = torch.arange(80)[torch.arange(80) % 3 == 0]
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gat", hidden=4, layers=2, heads=2, dropout=0.0), 5, 3)
    full = torch.nn.functional.cross_entropy(model(x, ei)[train], y[train])
    full.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    plan = build_plan(ei, 80, train, chunks, hops=2)
    xs, ys, P = plan.features(x), plan.targets(y), plan.size
    assert int((ys != IGNORE).sum()) == train.numel()
    loss_fn = summed_loss(float(train.numel()), multilabel=False)
    total = 0.0
    for i, b in enumerate(plan.batches):
        loss = loss_fn(model(xs[i * P : (i + 1) * P], b.edge_index), ys[i * P : (i + 1) * P])
        loss.backward()  # gradients accumulate over micro-batches, as in GPipe
        total += float(loss.detach())
    assert total == pytest.approx(float(full), abs=1e-5)
    for p, g in zip(model.parameters(), ref):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)


def test_index_plan_loses_edges_between_chunks():
    ei, _, _ = random_graph()
    one = build_plan(ei, 80, torch.arange(80), 1, 2, mode="index")
    four = build_plan(ei, 80, torch.arange(80), 4, 2, mode="index")
    assert one.batches[0].edge_index.size(1) == ei.size(1)
    assert sum(b.edge_index.size(1) for b in four.batches) < ei.size(1)
    assert torch.equal(torch.cat([b.nodes for b in four.batches]), torch.arange(80))
    assert four.halo_overhead == 1.0  # index chunks never duplicate a node


def test_more_chunks_than_targets_is_a_usage_error():
    ei, _, _ = random_graph()
    with pytest.raises(UsageError, match="--chunks 5 is more than the 4 training nodes"):
        build_plan(ei, 80, torch.arange(4), 5, 2, what="training nodes")


def test_multilabel_targets_carry_row_weights():
    g = tiny_graph()
    y = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0], [0, 1]])
    plan = build_plan(g.edge_index, 6, torch.tensor([0, 4]), 2, 1)
    t = plan.targets(y)
    assert t.shape == (2 * plan.size, 3)
    assert float(t[:, -1].sum()) == 2.0
