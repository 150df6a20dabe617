"""evaluation.graph_logits: the bounded-memory paths for large graphs equal plain full-graph inference."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import coalesce, remove_self_loops

from gnnpar.config.schema import Config
from gnnpar.configure import resolve
from gnnpar.models import build_model
from gnnpar.training.evaluation import EvalGraphCache, graph_logits


def random_graph(multigraph: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """400 nodes, 16 features; nodes 350.. are isolated; directed edges in random order.

    ``multigraph``: with duplicate edges and self-loops; otherwise a simple directed graph.
    """
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 350, (2, 3000), generator=g)
    if multigraph:
        loops = torch.arange(0, 350, 3).repeat(2, 1)
        edge_index = torch.cat([edge_index, loops, edge_index[:, :100]], 1)
    else:
        edge_index = coalesce(remove_self_loops(edge_index)[0])
    edge_index = edge_index[:, torch.randperm(edge_index.size(1), generator=g)]
    return torch.randn(400, 16, generator=g), edge_index


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
@pytest.mark.parametrize("multigraph", [False, True])
def test_large_graph_paths_equal_full_graph_inference(name, multigraph):
    x, edge_index = random_graph(multigraph)
    cfg = Config()
    cfg.model.name = name
    resolve(cfg)
    torch.manual_seed(0)
    model = build_model(cfg.model, 16, 5).eval()
    full = graph_logits(model, x, edge_index)  # small enough: the plain path
    # Limits below E x width x 4 bytes force the large-graph path: sparse adjacency (gcn; sage
    # on a simple graph) or layer-wise chunks of ~200 and ~1,000 destination edges (gat; sage
    # with duplicate edges).
    width = max(max(p.shape) for p in model.parameters() if p.dim() == 2)
    for edges_per_chunk in (200, 1000):
        large = graph_logits(model, x, edge_index, limit=4 * width * edges_per_chunk)
        torch.testing.assert_close(large, full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_eval_graph_cache_builds_the_adjacency_once_for_several_models(name):
    """With an EvalGraphCache the sparse adjacency of the first call serves the next models."""
    x, edge_index = random_graph(multigraph=False)
    cfg = Config()
    cfg.model.name = name
    resolve(cfg)
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(build_model(cfg.model, 16, 5).eval())
    expected = [graph_logits(m, x, edge_index) for m in models]  # plain path, no cache
    cache = EvalGraphCache()
    got = [graph_logits(models[0], x, edge_index, limit=1, cache=cache)]
    adj_t = cache.adj_t
    assert adj_t.layout == torch.sparse_csr and adj_t.shape == (400, 400)
    got.append(graph_logits(models[1], x, edge_index, limit=1, cache=cache))
    assert cache.adj_t is adj_t  # not rebuilt for the second model
    edited = edge_index.clone()
    graph_logits(models[1], x, edited, limit=1, cache=cache)  # another graph: its own adjacency
    assert cache.adj_t is not adj_t
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
