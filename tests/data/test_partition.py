"""Cluster-GCN partitions: exact subgraphs on hand-made graphs, METIS on awkward inputs, caching."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from gnnpar import UsageError
from gnnpar.configure import build_config
from gnnpar.data.datasets import load_dataset
from gnnpar.data.partition import (
    build_partitioned,
    cache_path,
    dataset_key,
    induced_batch,
    load_or_build,
    load_partitions,
    metis_partition,
    partition_nodes,
    random_partition,
    symmetric_csr,
)
from helpers import tiny_graph


def edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


def assert_disjoint_cover(part: torch.Tensor, num_nodes: int, num_parts: int) -> None:
    assert part.shape == (num_nodes,)
    assert int(part.min()) >= 0 and int(part.max()) < num_parts  # each node in exactly one part
    assert torch.bincount(part, minlength=num_parts).sum() == num_nodes
    assert bool((torch.bincount(part, minlength=num_parts) > 0).all())


def test_random_partition_is_balanced_disjoint_and_covers_every_node():
    part = random_partition(103, 8, seed=3)
    assert_disjoint_cover(part, 103, 8)
    sizes = torch.bincount(part, minlength=8)
    assert int(sizes.max() - sizes.min()) <= 1
    assert torch.equal(part, random_partition(103, 8, seed=3))  # seeded
    assert not torch.equal(part, random_partition(103, 8, seed=4))


def test_two_triangles_split_into_their_induced_subgraphs():
    g = tiny_graph()  # triangles 0-1-2 and 3-4-5 joined by the edge 2-3
    graph = build_partitioned(g, torch.tensor([0, 0, 0, 1, 1, 1]), 2)
    b0, b1 = graph.batch(0), graph.batch(1)
    triangle = {(0, 1), (1, 0), (1, 2), (2, 1), (0, 2), (2, 0)}
    assert edge_set(b0.edge_index) == triangle and b0.edge_index.size(1) == 6
    assert edge_set(b1.edge_index) == triangle  # 3,4,5 relabelled 0,1,2; edge 2-3 dropped
    assert b0.n_id.tolist() == [0, 1, 2] and b1.n_id.tolist() == [3, 4, 5]
    assert torch.equal(b1.x, g.x[3:]) and torch.equal(b1.y, g.y[3:])
    assert torch.equal(b1.train_mask, g.train_mask[3:])
    # Interleaved parts: nodes reordered by part, ids local to each part.
    graph = build_partitioned(g, torch.tensor([1, 0, 1, 0, 1, 0]), 2)
    assert graph.batch(0).n_id.tolist() == [1, 3, 5]
    assert edge_set(graph.batch(0).edge_index) == {(1, 2), (2, 1)}  # 3-5 -> local 1-2
    assert edge_set(graph.batch(1).edge_index) == {(0, 1), (1, 0)}  # 0-2 -> local 0-1


@pytest.mark.parametrize("method", ["random", "metis"])
def test_batches_equal_pyg_induced_subgraphs_on_citeseer(method):
    data = load_dataset("citeseer", "/nonexistent").data
    part = partition_nodes(method, data.edge_index, data.num_nodes, 8, seed=0)
    assert_disjoint_cover(part, data.num_nodes, 8)
    graph = build_partitioned(data, part, 8)
    seen = torch.cat([graph.batch(p).n_id for p in range(8)])
    assert torch.equal(seen.sort().values, torch.arange(data.num_nodes))  # disjoint and complete
    for p in range(8):
        ref, got = induced_batch(data, (part == p).nonzero().view(-1)), graph.batch(p)
        assert torch.equal(ref.n_id, got.n_id) and torch.equal(ref.x, got.x)
        assert edge_set(ref.edge_index) == edge_set(got.edge_index)
        assert ref.edge_index.size(1) == got.edge_index.size(1)


def test_metis_on_citeseer_cuts_fewer_edges_than_random():
    data = load_dataset("citeseer", "/nonexistent").data
    n = data.num_nodes
    assert int((torch.bincount(data.edge_index.view(-1), minlength=n) == 0).sum()) == 48
    kept = {}
    for method in ("random", "metis"):
        part = partition_nodes(method, data.edge_index, n, 8, seed=0)
        kept[method] = build_partitioned(data, part, 8).tensors["edge_index"].size(1)
    assert kept["metis"] > 4 * kept["random"]


def test_metis_copes_with_directed_edges_self_loops_and_isolated_nodes():
    # Two directed 5-cycles with self-loops and a duplicate, plus isolated nodes 10..13.
    src = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5, 2, 2]
    dst = [1, 2, 3, 4, 0, 6, 7, 8, 9, 5, 0, 5, 3, 2]
    edge_index = torch.tensor([src, dst])
    indptr, indices = symmetric_csr(edge_index, 14)
    assert indptr.tolist()[-1] == 20  # 10 undirected edges, both directions, no loops/dupes
    assert sorted(indices[indptr[0] : indptr[1]].tolist()) == [1, 4]
    assert indptr[10:].tolist() == [20] * 5  # isolated nodes have empty rows
    part = metis_partition(edge_index, 14, 2, seed=0)
    assert_disjoint_cover(part, 14, 2)
    cycle_a, cycle_b = part[:5].unique(), part[5:10].unique()
    assert cycle_a.numel() == 1 and cycle_b.numel() == 1 and cycle_a != cycle_b  # cut = 0


def test_more_partitions_than_nodes_is_a_usage_error():
    with pytest.raises(UsageError, match="Use fewer --partitions"):
        build_partitioned(tiny_graph(), random_partition(6, 8, 0), 8)


def test_partition_cache_hit_and_invalidation(tmp_path):
    data = load_dataset("cora", "/nonexistent").data
    path = cache_path(tmp_path, "cora-scale1", 4, "metis", 7)
    assert path == tmp_path / "cache" / "partitions" / "cora-scale1-metis-4-seed7.pt"
    first, hit = load_or_build(data, "metis", 4, 7, path)
    assert not hit and path.exists()
    second, hit = load_or_build(data, "metis", 4, 7, path)
    assert hit
    for key, value in first.tensors.items():
        assert torch.equal(value, second.tensors[key]), key
    # A different graph under the same name (e.g. regenerated) is not served the old file.
    other = Data(x=data.x, edge_index=data.edge_index[:, :-2], y=data.y, train_mask=data.train_mask)
    third, hit = load_or_build(other, "metis", 4, 7, path)
    assert not hit and third.tensors["edge_index"].size(1) <= first.tensors["edge_index"].size(1)
    assert not list(path.parent.glob(".*"))  # no temporary files left behind


def test_user_graphs_share_partitions_by_content_not_by_file_name(tmp_path):
    # Two different graphs both saved as graph.pt, and a renamed copy of the first one.
    first, second = tiny_graph(), tiny_graph()
    second.x = second.x + 1
    paths = {"a": tmp_path / "a" / "graph.pt", "b": tmp_path / "b" / "graph.pt"}
    for path, g in zip(paths.values(), (first, second)):
        path.parent.mkdir()
        torch.save(g, path)
    paths["copy"] = tmp_path / "copy.pt"
    paths["copy"].write_bytes(paths["a"].read_bytes())
    root = tmp_path / "data"

    def partition(key: str):
        flags = {"dataset": str(paths[key]), "model": "gcn", "partitions": "2"}
        cfg = build_config(None, {**flags, "partitioner": "metis", "data_root": str(root)})
        ds = load_dataset(str(paths[key]), root, seed=cfg.run.seed)
        graph, _, hit = load_partitions(cfg, ds)
        return dataset_key(ds, cfg.data.scale), graph, hit

    key_a, graph_a, hit_a = partition("a")
    key_b, _, hit_b = partition("b")
    # Keyed by file name, b (same edges, other features) was served a's file, features and all.
    assert not hit_a and not hit_b
    _, graph_b, hit = partition("b")
    assert hit and torch.equal(graph_b.tensors["x"], second.x[graph_b.tensors["n_id"]])
    again_key, again, hit = partition("a")
    assert hit and again_key == key_a
    assert torch.equal(again.tensors["part"], graph_a.tensors["part"])
    copy_key, _, hit = partition("copy")
    assert hit and copy_key == key_a  # a renamed copy is the same graph
    assert key_a.startswith("user-") and len(key_a) == 25 and key_a != key_b
    names = sorted(p.name for p in (root / "cache" / "partitions").glob("*.pt"))
    assert names == sorted(f"{k}-metis-2-seed0.pt" for k in (key_a, key_b))


def test_batches_keep_duplicates_and_self_loops_in_destination_then_source_order():
    # A shuffled, directed, messy edge list: duplicates (one edge three times), self-loops,
    # one-way edges, and isolated nodes; the build must keep every edge inside a part exactly
    # as often as given, ordered by (destination, source) inside each batch.
    g = torch.Generator().manual_seed(5)
    n = 60
    base = torch.randint(0, n - 4, (2, 400), generator=g)  # nodes 56..59 stay isolated
    extra = torch.tensor([[3, 3, 3, 7, 7], [9, 9, 9, 7, 7]])  # 3->9 three times, 7->7 twice
    edge_index = torch.cat([base, extra], 1)[:, torch.randperm(405, generator=g)]
    data = Data(x=torch.randn(n, 3, generator=g), edge_index=edge_index, y=torch.arange(n) % 2)
    for method in ("random", "metis"):
        part = partition_nodes(method, edge_index, n, 5, seed=1)
        graph = build_partitioned(data, part, 5)
        total = 0
        for p in range(5):
            ref, got = induced_batch(data, (part == p).nonzero().view(-1)), graph.batch(p)
            order = torch.argsort(ref.edge_index[1] * n + ref.edge_index[0], stable=True)
            assert torch.equal(got.edge_index, ref.edge_index[:, order]), (method, p)
            total += got.edge_index.size(1)
        assert total == int((part[edge_index[0]] == part[edge_index[1]]).sum())
