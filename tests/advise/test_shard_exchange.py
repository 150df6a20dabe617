"""gnnpar advise's model of a sampled run across shards (gnnpar.advise.shard_exchange): what a
rank sends per step from a batch's frontier sizes and the edge cut, and the seconds it costs on
the cluster. The model against the bytes a real run across shards sent: tests/e2e/
test_shard_sampled.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gnnpar import UsageError
from gnnpar.advise import shard_exchange as sx
from gnnpar.advise.fit import Facts, Split, fit_grid
from gnnpar.advise.predict import Candidate, ClusterSpec, build_grid, make_cluster, predict
from gnnpar.advise.profile import Profile
from gnnpar.advise.simulate import NONE, Cluster, Link


def test_seeds_dealt_regardless_of_owner_make_every_hop_remote_by_the_hosts_alone():
    # p0 = 1/H is the recurrence's fixed point: the cut does not change the remote share
    for hosts in (2, 3, 16, 64):
        for cut in (0.0, 0.1, 0.366, 0.9):
            got = sx.remote_shares(3, hosts, cut)
            assert got == pytest.approx([(hosts - 1) / hosts] * 4)


def test_seeds_on_their_owner_make_the_cut_matter():
    # seeds local (p0 = 1): hop 1's nodes are remote as often as an edge is cut
    got = sx.remote_shares(2, 2, 0.25, local_first=1.0)
    assert got == pytest.approx([0.0, 0.25, 0.25 * 0.75 + 0.75 * 0.25])


def test_the_cut_for_other_host_counts_scales_as_a_random_partitions():
    made = {"hosts": 2, "edge_cut_share": 0.3}
    assert sx.cut_share(made, 2) == 0.3
    assert sx.cut_share(made, 4) == pytest.approx(0.3 * 0.75 / 0.5)
    assert sx.cut_share(made, 64) == pytest.approx(min(1.0, 0.3 * (63 / 64) / 0.5))
    assert sx.cut_share({}, 4) == 0.75  # an unsharded graph: a random partition's
    assert sx.cut_share(made, 1) == 0.0


def test_bytes_of_a_step_by_hand():
    # 2 hosts x 1 rank, one hop: 10 seeds, 30 new nodes, 40 sampled edges, rows of 16 bytes
    t = sx.traffic([10.0, 30.0], [40.0], 16, 2, 1, 0.5)
    half = 0.5
    want = [8, 8 * (half * 10 + 1), 8, 8 * half * (10 + 40)]  # the hop: sizes, ask, sizes, answer
    # the features of all 40 nodes: sizes, ask, answer (its sizes known to the asker)
    want += [8, 8 * half * 40, 16 * half * 40]
    assert t.rounds == pytest.approx(want)
    assert t.bytes_sent == pytest.approx(sum(want))
    assert sx.traffic([10.0, 30.0], [40.0], 16, 1, 4, 0.5).bytes_sent == 0  # one host


def test_exchange_seconds_pay_the_link_per_round():
    net = Link(1e-3, 125e6)  # 1 Gbit/s, 1 ms
    c = Cluster(2, 1, ring_step=Link(0.0, 1e12), p2p=Link(0.0, 1e12), network=net)
    t = sx.Traffic(2e6, [1e6, 1e6])
    got = sx.exchange_s(c, t)
    # two rounds, each gloo's two latencies of a message (GLOO_P2P_LATENCIES) and its bytes
    assert got == pytest.approx(2 * (2e-3 + 1e6 / 125e6), rel=1e-6)
    assert sx.exchange_s(Cluster(1, 2, Link(0, 1e12), Link(0, 1e12)), t) == 0.0


def test_a_runs_exchange_is_every_ranks_steps_of_it():
    t = sx.traffic([10.0, 30.0], [40.0], 16, 2, 2, 0.5)
    assert sx.run_bytes(t, steps=5, epochs=3, world=4) == pytest.approx(t.bytes_sent * 60)
    assert sx.run_bytes(sx.traffic([10.0, 30.0], [40.0], 16, 1, 4, 0.5), 5, 3, 4) == 0


def test_each_hops_cut_is_what_turns_one_measured_share_into_the_next():
    for hosts in (2, 3, 8):
        cuts = [0.1, 0.3, 0.05]
        shares = sx.remote_shares(3, hosts, cuts, local_first=1.0)
        assert sx.hop_cuts(shares, hosts) == pytest.approx(cuts)
    # at the fixed point (seeds dealt regardless of their owner) nothing is left to tell
    assert sx.hop_cuts([0.5, 0.5], 2) == [0.5]


def test_a_host_short_of_training_nodes_borrows_them_from_the_others():
    # 140 training nodes on 2 hosts of 1 rank: 70 each; shard 0 owns 56, so 14 are borrowed
    assert sx.borrowed_share([56, 84], 2, 1) == pytest.approx(14 / 140)
    assert sx.borrowed_share([70, 70], 2, 1) == 0.0
    assert sx.borrowed_share([56, 84], 4, 1) == 0.0  # another host count: taken as balanced
    batch = {"nodes_per_hop": [10.0, 30.0], "edges_per_hop": [40.0]}
    shards = {"hosts": 2, "edge_cut_share": 0.2, "train_per_shard": [56, 84]}
    # a profile without the local record: the folder's cut, the borrowed seeds remote
    shares = sx.seed_deal(batch, shards, 2, 1, "local")[0]
    assert shares == pytest.approx([0.1, 0.1 * 0.8 + 0.9 * 0.2])


def test_the_measured_local_shares_hold_on_their_hosts_and_scale_to_others():
    local = {"hosts": 2, "remote_per_hop": [0.0, 0.1, 0.25],
             "nodes_per_hop": [5.0, 20.0, 60.0], "edges_per_hop": [25.0, 80.0]}  # fmt: skip
    batch = {"nodes_per_hop": [10.0, 50.0, 200.0], "edges_per_hop": [50.0, 200.0]} | {
        "local": local
    }
    shards = {"hosts": 2, "edge_cut_share": 0.3, "train_per_shard": [100, 100]}
    shares, nodes, edges = sx.seed_deal(batch, shards, 2, 1, "local")
    assert shares == pytest.approx([0.0, 0.1, 0.25])
    assert nodes == [10.0, 40.0, 120.0] and edges == [50.0, 160.0]  # the profile's 10 seeds
    c = sx.hop_cuts([0.0, 0.1, 0.25], 2)
    four = [x * 0.75 / 0.5 for x in c]  # each hop's cut, scaled as a random partition's
    assert sx.seed_deal(batch, shards, 4, 1, "local")[0] == pytest.approx(
        sx.remote_shares(2, 4, four, local_first=1.0)
    )
    with pytest.raises(ValueError, match="--seeds"):
        sx.seed_deal(batch, shards, 2, 1, "mine")


STEP = {"compute_s": 0.010, "main_sample_s": 0.002, "sample_s": 0.002, "first_batch_s": 0.0}


def _sharded_profile() -> Profile:
    local = {"hosts": 2, "batches": 6, "remote_per_hop": [0.0, 0.2, 0.3],
             "nodes_per_hop": [1024.0, 3000.0, 7000.0], "edges_per_hop": [5000.0, 20000.0]}  # fmt: skip
    batch = STEP | {"fanouts": [5, 5], "nodes_per_hop": [1024.0, 4000.0, 9000.0],
                    "edges_per_hop": [5000.0, 20000.0], "local": local}  # fmt: skip
    return Profile(
        machine="test", cores=2, threads=1, dataset="f", model="sage", epochs=1, seed=0,
        num_nodes=10**6, num_train=4096, param_bytes=1000, base_rss_bytes=100 << 20,
        sampled={"1024": batch},
        shards={"hosts": 2, "edge_cut_share": 0.3, "row_bytes": 512,
                "train_per_shard": [2048, 2048]},
    )  # fmt: skip


def test_advice_json_carries_the_exchange_of_each_deal_of_seeds():
    prof = _sharded_profile()
    spec = ClusterSpec(2, 1, Link(1e-3, 125e6))
    got = {}
    for deal in ("global", "local"):
        c = Candidate("sampled", {"batch_size": 1024, "loader_workers": 0, "seeds": deal}, 2)
        got[deal] = predict(c, prof, spec, NONE, 1)
        ex = got[deal].to_json()["exchange"]
        shares, nodes, edges = sx.seed_deal(prof.sampled["1024"], prof.shards, 2, 1, deal)
        t = sx.traffic(nodes, edges, 512, 2, 1, 0.3, shares)
        assert ex["seeds"] == deal and ex["remote_share_per_hop"] == pytest.approx(shares)
        assert ex["bytes_per_step"] == pytest.approx(t.bytes_sent)
        assert ex["seconds_per_step"] == pytest.approx(
            sx.exchange_s(make_cluster(spec, prof, 2), t)
        )
        # the network column: every rank's exchange over the run (2 steps of 1024 a rank)
        assert got[deal].bytes_on_network >= ex["bytes_per_step"] * 2 * 2
    assert got["global"].exchange["remote_share_per_hop"] == pytest.approx([0.5] * 3)
    assert got["local"].exchange["remote_share_per_hop"] == pytest.approx([0.0, 0.2, 0.3])
    assert got["local"].exchange["bytes_per_step"] < 0.5 * got["global"].exchange["bytes_per_step"]
    assert got["local"].epoch_s < got["global"].epoch_s  # less to send over the same link
    # one host: nothing crosses a link, no exchange in advice.json
    c = Candidate("sampled", {"batch_size": 1024, "loader_workers": 0}, 2)
    assert "exchange" not in predict(c, prof, ClusterSpec(1, 2), NONE, 1).to_json()


def test_the_exchange_overlaps_the_step_where_the_next_batch_is_made_on_a_thread(monkeypatch):
    """Across shards the run makes batch i+1 (its sampling and its exchanges) on a thread while
    the model trains on batch i: a step costs the longer of the two, not their sum as in line
    (``GNNPAR_BATCH_AHEAD=0``)."""
    prof = _sharded_profile()
    spec = ClusterSpec(2, 1, Link(1e-3, 125e6))
    c = Candidate("sampled", {"batch_size": 1024, "loader_workers": 0, "seeds": "global"}, 2)
    ahead = predict(c, prof, spec, NONE, 1)
    monkeypatch.setenv("GNNPAR_BATCH_AHEAD", "0")
    inline = predict(c, prof, spec, NONE, 1)
    exchange = ahead.exchange["seconds_per_step"]
    assert exchange > STEP["compute_s"]  # the link is the longer part here
    assert inline.exchange == ahead.exchange  # the same bytes, the same seconds on the link
    steps = 2  # 2048 training nodes a rank, batches of 1024
    assert inline.train_time_s >= steps * (STEP["compute_s"] + STEP["main_sample_s"] + exchange)
    making = STEP["main_sample_s"] + exchange
    on_thread = (steps * making + STEP["compute_s"]) * 0.999
    assert on_thread <= ahead.train_time_s < inline.train_time_s


def test_the_grid_deals_seeds_both_ways_only_on_several_hosts_of_a_sharded_graph():
    two = build_grid(("sampled",), 2, 2, {}, hosts=2)
    assert sorted(c.settings["seeds"] for c in two if c.settings["batch_size"] == 512
                  and c.settings["loader_workers"] == 0) == ["global", "local"]  # fmt: skip
    assert all("seeds" not in c.settings for c in build_grid(("sampled",), 2, 2, {}, hosts=1))
    fixed = build_grid(("sampled",), 2, 2, {"seeds": "local"}, hosts=2)
    assert {c.settings["seeds"] for c in fixed} == {"local"}

    def fitted(grid, fixed, shards):
        req = SimpleNamespace(grid=list(grid), fixed=fixed, omitted={}, images=0)
        fit_grid(req, Facts(10**4, 4096, lambda p: Split(True), shards=shards))
        return [c.settings for c in req.grid]

    assert all(s["seeds"] in ("global", "local") for s in fitted(two, {}, 2))
    # not sharded: --seeds means nothing; the local configurations left out
    plain = fitted(two, {}, 0)
    assert plain and all("seeds" not in s for s in plain) and len(plain) == len(two) // 2
    with pytest.raises(UsageError, match="--seeds local"):
        fitted(fixed, {"seeds": "local"}, 0)


def test_validate_compares_the_predicted_bytes_with_what_the_ranks_sent(tmp_path):
    from gnnpar.advise.validate import _case, _combined, _measured

    c = Candidate("sampled", {"batch_size": 1024, "loader_workers": 0, "seeds": "local"}, 2)
    p = predict(c, _sharded_profile(), ClusterSpec(2, 1, Link(1e-3, 125e6)), NONE, 1)
    predicted = p.exchange["bytes_per_step"]
    result = {"train_time_s": 4.0, "epochs": 2, "exchange_bytes_per_step": [1e6, 3e6]}
    (tmp_path / "result.json").write_text(json.dumps(result))
    case = _measured(_case(p, ["train"]), [str(tmp_path)], 0, "")
    assert case["measured_epoch_s"] == 2.0
    assert case["predicted_exchange_bytes_per_step"] == predicted
    assert case["measured_exchange_bytes_per_step"] == 2e6  # the ranks' mean
    assert case["exchange_error"] == pytest.approx((predicted - 2e6) / 2e6)
    again = dict(case, measured_exchange_bytes_per_step=4e6)
    both = _combined([case, again])  # repetitions: the median
    assert both["measured_exchange_bytes_per_step"] == 3e6
