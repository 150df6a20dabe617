"""gnnpar advise's measurement of a sharded graph seen from each host's own seeds
(gnnpar.advise.profile.seed_deals, for ``--seeds local``): per hop, the share of a batch's new
nodes owned by another host, on graphs small enough to count by hand."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from gnnpar.advise import shard_exchange as sx
from gnnpar.advise.profile import Profile
from gnnpar.advise.profile import seed_deals as sd
from gnnpar.data.prepared import made_record, write_graph
from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler
from gnnpar.data.shards import open_shards, write_shards

# Six nodes, shard 0 owns 0..2 and shard 1 owns 3..5 (bounds [0, 3, 6]); node v aggregates
# the in-neighbours IN[v]. Four of the twelve edges cross the shards (0<-3, 2<-4, 3<-0, 5<-2).
IN = {0: [1, 3], 1: [0, 2], 2: [1, 4], 3: [4, 0], 4: [3, 5], 5: [4, 2]}
BOUNDS = torch.tensor([0, 3, 6])


def _sampler() -> NeighborSampler:
    rowptr = torch.tensor([0, *torch.tensor([len(IN[v]) for v in range(6)]).cumsum(0).tolist()])
    col = torch.tensor([u for v in range(6) for u in IN[v]])
    return NeighborSampler(CSRGraph(rowptr, col), [2, 2])  # every neighbour: no draw


def test_each_hosts_own_seeds_by_hand():
    # host 0's seed 0: hop 1 {1, 3} (3 remote), hop 2 {2, 4} (4 remote)
    # host 1's seed 4: hop 1 {3, 5} (none remote), hop 2 {0, 2} (both remote)
    got = sd.local_frontiers(_sampler().sample, torch.tensor([0, 4]), BOUNDS, 1, seed=0)
    assert got["hosts"] == 2 and got["batches"] == 2 * sd.LOCAL_BATCHES
    assert got["remote_per_hop"] == pytest.approx([0.0, 1 / 4, 3 / 4])
    assert got["nodes_per_hop"] == [1.0, 2.0, 2.0]
    assert got["edges_per_hop"] == [2.0, 4.0]
    # the folder's cut alone (1/3 for every hop) would have said 1/3, then 4/9
    assert sx.remote_shares(2, 2, 1 / 3, 1.0) == pytest.approx([0.0, 1 / 3, 4 / 9])


def test_the_local_deal_takes_the_measured_shares_and_the_global_deal_the_hosts_alone():
    local = sd.local_frontiers(_sampler().sample, torch.tensor([0, 4]), BOUNDS, 1, seed=0)
    batch = {"nodes_per_hop": [1.0, 2.0, 2.0], "edges_per_hop": [2.0, 4.0], "local": local}
    shards = {"hosts": 2, "edge_cut_share": 1 / 3, "row_bytes": 16, "train_per_shard": [1, 1]}
    shares, nodes, edges = sx.seed_deal(batch, shards, 2, 1, "local")
    assert shares == pytest.approx([0.0, 1 / 4, 3 / 4])
    assert (nodes, edges) == ([1.0, 2.0, 2.0], [2.0, 4.0])
    assert sx.seed_deal(batch, shards, 2, 1, "global")[0] == pytest.approx([0.5, 0.5, 0.5])
    # the bytes of a step follow: hop 0 asks nothing, hop 1 a quarter of its nodes; the rows
    # of (0 + 0.5 + 1.5) remote nodes of 5
    t = sx.traffic(nodes, edges, 16, 2, 1, 1 / 3, shares)
    want = [8, 8 * (0 * 1 + 1), 8, 0.0, 8, 8 * (0.25 * 2 + 1), 8, 8 * 0.25 * (2 + 4)]
    want += [8, 8 * 2.0, 16 * 2.0]
    assert t.rounds == pytest.approx(want) and t.remote_shares == pytest.approx(shares)


def _graph(tmp_path, n: int = 60):
    g = torch.Generator().manual_seed(1)
    ei = torch.randint(0, n, (2, 6 * n), generator=g)
    split = torch.arange(n) % 3
    masks = {f"{s}_mask": split == i for i, s in enumerate(("train", "val", "test"))}
    data = Data(x=torch.randn(n, 4, generator=g), edge_index=ei,
                y=torch.randint(0, 3, (n,), generator=g), **masks)  # fmt: skip
    meta = {"name": "g", "num_classes": 3, "multilabel": False, "directed": True}
    return write_graph(dict(data), meta, tmp_path / "g", "fp32", made_record("t", None, 0, "g"))


def test_the_shards_structure_is_the_graphs_in_renumbered_ids(tmp_path):
    folder = _graph(tmp_path)
    sharded, _ = write_shards(folder, tmp_path / "s2", 2, "random", 0)
    csr, bounds, train = sd.shard_structure(str(sharded))
    shards = open_shards(sharded)
    orig = torch.cat([torch.from_numpy(s.array("orig_ids").copy()) for s in shards])
    new_of = torch.empty_like(orig)
    new_of[orig] = torch.arange(orig.numel())
    from gnnpar.data.prepared import open_prepared

    p = open_prepared(folder)
    ptr = torch.from_numpy(p.array("indptr").copy())
    idx = torch.from_numpy(p.array("indices").copy()).long()
    for v in range(orig.numel()):  # node v's in-neighbours, in the renumbered ids
        mine = csr.col[csr.rowptr[new_of[v]] : csr.rowptr[new_of[v] + 1]].long()
        assert sorted(mine.tolist()) == sorted(new_of[idx[ptr[v] : ptr[v + 1]]].tolist())
    assert bounds.tolist() == [0, shards[0].end, orig.numel()]
    assert sorted(orig[train].tolist()) == list(range(0, orig.numel(), 3))  # the train split


def test_a_profile_gets_the_shard_record_of_every_batch_size(tmp_path):
    folder = _graph(tmp_path)
    sharded, rec = write_shards(folder, tmp_path / "s2", 2, "random", 0)
    prof = Profile("t", 2, 1, str(sharded), "sage", 1, 0, 60, 20, 1, 1)
    prof.shards = sd.shards_of_folder(str(sharded))
    assert prof.shards == {"hosts": 2, "edge_cut_share": rec["edge_cut_share"], "row_bytes": 16}
    prof.sampled = {"8": {"fanouts": [3, 3]}, "16": {"fanouts": [3, 3]}}
    assert sd.lacks_shard_record(prof)
    sd.add_shard_record(prof, str(sharded))
    assert not sd.lacks_shard_record(prof)
    assert sum(prof.shards["train_per_shard"]) == 20
    for key in ("8", "16"):
        local = prof.sampled[key]["local"]
        assert local["hosts"] == 2 and local["remote_per_hop"][0] == 0.0  # own seeds
        # 20 training nodes, 10 a shard on average
        assert local["nodes_per_hop"][0] == min(int(key), 10)
        assert all(0.0 <= r <= 1.0 for r in local["remote_per_hop"])


def test_a_saved_profile_serves_another_sharding_of_the_same_graph_only(tmp_path):
    from gnnpar.advise.command import same_graph_sharded

    folder = _graph(tmp_path)
    two, _ = write_shards(folder, tmp_path / "s2", 2, "random", 0)
    three, _ = write_shards(folder, tmp_path / "s3", 3, "stream", 0)
    assert same_graph_sharded(str(two), str(three))
    assert not same_graph_sharded(str(two), str(folder))  # unsharded: its own profile
    (tmp_path / "o").mkdir()
    other = _graph(tmp_path / "o", n=61)
    assert not same_graph_sharded(
        str(two), str(write_shards(other, tmp_path / "o2", 2, "random", 0)[0])
    )
    assert not same_graph_sharded(str(two), "cora")  # not a folder
