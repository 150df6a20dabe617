"""Cluster-GCN's parts of a sharded graph (gnnpar.data.shard_parts): a host holding only its
shard builds, from its shard alone, exactly the subgraphs that a host holding every shard builds
over the unsharded graph in original ids; and the parts are dealt to the ranks of their host."""

from __future__ import annotations

import pytest
import torch

from gnnpar import UsageError
from gnnpar.data import shard_parts, shards
from gnnpar.data.partition import NODE_KEYS
from gnnpar.data.prepare_command import run_prepare
from gnnpar.data.sampling.distributed import ShardGraph


@pytest.fixture(scope="module")
def cora_sharded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cora-parts")
    got = {}
    for h, method in ((2, "metis"), (3, "random")):
        out = tmp / f"cora-{h}"
        run_prepare("cora", str(out), None, None, None, str(tmp / "root"), None, True,
                    shards=str(h), partitioner=method)  # fmt: skip
        got[h] = out
    return got


@pytest.mark.parametrize(("hosts", "partitions", "method"), [(2, 5, "metis"), (3, 7, "random")])
def test_each_host_builds_from_its_shard_the_parts_of_the_whole_graph(
    cora_sharded, hosts, partitions, method
):
    folder = cora_sharded[hosts]
    whole = shards.load_sharded(folder).data
    ref, sizes = shard_parts.whole_graph_parts(whole, folder, partitions, method, seed=4)
    assert sizes == shard_parts.parts_per_shard(partitions, hosts) and sum(sizes) == partitions
    assert ref.num_parts == partitions
    for h in range(hosts):
        g = ShardGraph.open(folder, h)
        mine, first, got_sizes = shard_parts.host_parts(g, h, partitions, method, seed=4)
        assert got_sizes == sizes and first == sum(sizes[:h]) and mine.num_parts == sizes[h]
        for p in range(sizes[h]):
            a, b = mine.batch(p), ref.batch(first + p)
            # the same nodes in the same order: the shard's local ids map to original ids
            assert torch.equal(g.orig_ids[a.n_id], b.n_id), (h, p)
            assert torch.equal(a.edge_index, b.edge_index), (h, p)
            for key in NODE_KEYS:
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (h, p, key)
    # a part never crosses shards: every part's nodes lie in one shard
    starts = torch.tensor([0, *torch.cumsum(torch.tensor(sizes), 0).tolist()])
    new_of_orig = torch.empty(whole.num_nodes, dtype=torch.long)
    for h, s in enumerate(shards.open_shards(folder)):
        new_of_orig[torch.from_numpy(s.array("orig_ids").copy())] = h
    for p in range(partitions):
        h = int(torch.searchsorted(starts, torch.tensor(p), right=True)) - 1
        assert bool((new_of_orig[ref.batch(p).n_id] == h).all()), p


def test_a_hosts_parts_go_to_its_own_ranks_once_each():
    sizes = [3, 2]
    mine, steps = shard_parts.deal_by_host(sizes, [0, 0, 1, 1], seed=5)
    assert steps == 2
    assert sorted(mine[0] + mine[1]) == [0, 1, 2] and sorted(mine[2] + mine[3]) == [3, 4]
    assert [len(m) for m in mine] == [2, 1, 1, 1]
    # ranks need not be numbered host by host: the deal follows each rank's host
    again, _ = shard_parts.deal_by_host(sizes, [0, 1, 0, 1], seed=5)
    assert again[0] == mine[0] and again[2] == mine[1] and again[1] == mine[2]
    with pytest.raises(UsageError, match="^shard 1 has 2 of the --partitions, fewer than its "):
        shard_parts.deal_by_host(sizes, [0, 1, 1, 1], seed=5)
    with pytest.raises(UsageError, match="^--partitions 1 is fewer than the graph's 2 shards"):
        shard_parts.parts_per_shard(1, 2)
