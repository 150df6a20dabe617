"""A stand-in's profile mapped onto a larger graph (gnnpar.advise.scale): step counts, part
costs, sampled work and memory per host, against hand computations."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from gnnpar.advise import simulate as sim
from gnnpar.advise.predict import Candidate, ClusterSpec, predict
from gnnpar.advise.profile import Profile
from gnnpar.advise.scale import (
    PAPERS100M,
    GraphShape,
    HopWork,
    evaluation_bytes,
    extrapolate_work,
    host_memory,
    measure_work,
    model_memory,
    scale_profile,
    target_partitions,
)

FREE = sim.Link(0.0, math.inf)  # a network that costs nothing: compute alone is left


def _profile(parts: list[float]) -> Profile:
    return Profile(
        machine="test",
        cores=2,
        threads=2,
        dataset="stand-in",
        model="gcn",
        epochs=1,
        seed=0,
        num_nodes=400,
        num_train=100,
        param_bytes=1000,
        base_rss_bytes=0,
        parts_step_s={"4": parts},
        sampled={
            "10": {
                "sample_s": 0.01,
                "main_sample_s": 0.02,
                "compute_s": 0.05,
                "first_batch_s": 0.0,
                "fanouts": [2, 2],
            }
        },
        memory={"parts4": {"state": 7, "activations": 11}, "sampled10": {"state": 7}},
    )


TARGET = GraphShape("target", 1000, 5000, 8, 3, 1000)


def test_part_size_kept():
    assert target_partitions(1_110_600, 100, PAPERS100M.num_nodes) == 10_000
    assert target_partitions(2_221_199, 200, PAPERS100M.num_nodes) == 10_000
    assert target_partitions(400, 4, 1000) == 10


def test_parts_repeat_the_stand_ins_and_keep_their_memory():
    big = scale_profile(_profile([0.1, 0.2, 0.3, 0.4]), TARGET, partitions={4: 10})
    assert big.parts_step_s == {"10": [0.1, 0.2, 0.3, 0.4, 0.1, 0.2, 0.3, 0.4, 0.1, 0.2]}
    assert big.memory["parts10"] == {"state": 7, "activations": 11}
    assert "parts4" not in big.memory and big.memory["sampled10"] == {"state": 7}
    assert (big.num_nodes, big.num_train, big.dataset) == (1000, 1000, "target")
    one = predict(
        Candidate("sequential", {"partitions": 10}, 1), big, ClusterSpec(1, 1), sim.NONE, 1
    )
    assert one.epoch_s == pytest.approx(2.3)  # every target part once, at its stand-in's cost


def test_cluster_gcn_steps_per_epoch_divide_the_parts_among_ranks():
    big = scale_profile(_profile([0.1] * 4), TARGET, partitions={4: 10})
    for world, steps in ((2, 5), (4, 3), (10, 1)):
        c = Candidate("allreduce", {"partitions": 10, "sync_every": 1}, world)
        p = predict(c, big, ClusterSpec(world, 1, FREE), sim.NONE, 1)
        assert p.epoch_s == pytest.approx(0.1 * steps)  # ceil(10 / world) lock-steps


def test_sampled_steps_scale_with_training_nodes_and_work():
    big = scale_profile(_profile([0.1] * 4), TARGET, work_ratio={10: (2.0, 3.0)})
    b = big.sampled["10"]
    assert (b["compute_s"], b["sample_s"], b["main_sample_s"]) == pytest.approx((0.1, 0.03, 0.06))
    assert b["fanouts"] == [2, 2]
    step = 0.1 + 0.06  # the rank samples (W = 0), then trains
    for hosts, steps in ((1, 100), (4, 25), (3, 34)):  # ceil((1000 // hosts) / 10)
        c = Candidate("sampled", {"batch_size": 10, "loader_workers": 0}, hosts)
        p = predict(c, big, ClusterSpec(hosts, 1, FREE), sim.NONE, 1)
        assert p.epoch_s == pytest.approx(steps * step)
    small = _profile([0.1] * 4)  # the stand-in itself: 100 training nodes, 10 steps
    c = Candidate("sampled", {"batch_size": 10, "loader_workers": 0}, 1)
    assert predict(c, small, ClusterSpec(1, 1), sim.NONE, 1).epoch_s == pytest.approx(0.7)


def test_extrapolated_work_follows_the_law_it_fits():
    def batch(n: float, g: float) -> HopWork:  # hop 1 draws 5 per seed, hop 2 3 per node
        u1, u2 = 0.99 - 30 * n**-g, 0.9 - 400 * n**-g
        nodes = [10.0, 50 * u1]
        nodes.append(3 * nodes[1] * u2)
        return HopWork(nodes, [50.0, 3 * nodes[1]])

    two = extrapolate_work([(10_000, batch(10_000, 1.0)), (20_000, batch(20_000, 1.0))])
    assert two.exponent == 1.0
    for n in (10_000, 50_000, 10**8):
        assert two(n).nodes == pytest.approx(batch(n, 1.0).nodes)
        assert two(n).edges == pytest.approx(batch(n, 1.0).edges)
    sizes = (10_000, 20_000, 50_000, 200_000)
    many = extrapolate_work([(n, batch(n, 0.5)) for n in sizes])
    assert many.exponent == pytest.approx(0.5)
    assert many(10**8).nodes == pytest.approx(batch(10**8, 0.5).nodes)
    assert two(10**4).total_nodes == pytest.approx(sum(batch(10**4, 1.0).nodes))
    with pytest.raises(ValueError):
        extrapolate_work([(10, batch(10, 1.0)), (10, batch(10, 1.0))])


def test_measured_work_of_a_graph_of_pairs():
    # nodes 2i <-> 2i+1; the even ones train: hop 1 finds each seed's partner (new), hop 2
    # draws the seed back from the partner (not new)
    n = 64
    ei = torch.stack([torch.arange(n), torch.arange(n) ^ 1])
    data = SimpleNamespace(edge_index=ei, train_mask=torch.arange(n) % 2 == 0)
    ds = SimpleNamespace(name="pairs", num_nodes=n, data=data)
    w = measure_work(ds, [3, 3], 8, batches=4)
    assert w.nodes == [8, 8, 0] and w.edges == [8, 8]
    assert (w.total_nodes, w.total_edges) == (16, 16)


def test_model_memory_is_footprints_for_the_target_shape():
    base = {"dataset": "cora", "hidden": 256, "layers": 3, "epochs": 1}
    sage = model_memory(
        {**base, "model": "sage", "strategy": "sampled", "batch-size": 1024, "fanouts": "15,10,5"},
        PAPERS100M,
    )
    # SAGEConv(i, o): lin_l (i x o + o) and lin_r (i x o); 128 -> 256 -> 256 -> 172; Adam
    params = (2 * 128 * 256 + 256) + (2 * 256 * 256 + 256) + (2 * 256 * 172 + 172)
    assert sage["state"] == params * 4 * 4 == 4_565_696
    # seeds and their first hop, 256 wide, in the 2 hidden blocks
    assert sage["activations"] == (1024 + 1024 * 15) * 256 * 2 * 4
    gcn = model_memory(
        {**base, "model": "gcn", "strategy": "sequential", "partitions": 10_000}, PAPERS100M
    )
    params = (128 * 256 + 256) + (256 * 256 + 256) + (256 * 172 + 172)
    assert gcn["state"] == params * 4 * 4
    assert gcn["activations"] == 11_106 * 256 * 2 * 4  # ceil(111,059,956 / 10,000) rows


def test_host_memory_of_papers100m_by_hand():
    n, e = 111_059_956, 1_615_685_872
    s = host_memory("sampled", PAPERS100M, 1, 4, rank_bytes=10**9, loader_workers=2)
    # CSR rowptr (n + 1) and col (e) int64, x n x 128 float32, y n int64
    assert s["shared graph"] == 888_479_656 + 12_925_486_976 + 56_862_697_472 + 888_479_648
    assert s["shared graph"] == 71_565_143_752
    assert s["sampler marks"] == 2 * n * 8  # one mark array per loader worker
    assert s["setup extra"] == 8 * (n + 1) + 8 * e
    assert s["ranks"] == 10**9
    assert host_memory("sampled", PAPERS100M, 2, 8, 10**9)["sampler marks"] == 2 * n * 8
    whole = n * (128 * 4 + 8 + 3) + 2 * 10**9 * 8  # reordered nodes, 1e9 intra-part edges
    a = host_memory("allreduce", PAPERS100M, 1, 4, 0, intra_part_edges=10**9)
    assert a["partitioned graph"] == math.ceil(whole / 4)
    g = host_memory("gossip", PAPERS100M, 1, 64, 0, intra_part_edges=10**9)
    assert g["partitioned graph"] == whole
    with pytest.raises(ValueError):
        host_memory("allreduce", PAPERS100M, 1, 4, 0)
    with pytest.raises(ValueError):
        host_memory("pipeline", PAPERS100M, 1, 4, 0)


def test_final_evaluation_lower_bound_by_hand():
    e = evaluation_bytes(PAPERS100M, 256)
    assert e["x"] == 56_862_697_472
    assert e["adjacency"] == 888_479_656 + 12_925_486_976
    assert e["activations"] == 2 * 111_059_956 * 256 * 4 == 227_450_789_888
