"""Cluster-GCN across shards (gnnpar.data.shard_parts, gnnpar.parallel.fetch): hosts, each a real
process of a gloo group whose folder holds only the top manifest and its own shard.

"The same model" here: with allreduce every step, 2 hosts each training its own shard's parts
reach the model that one host reaches over the unsharded graph when its 2 ranks are dealt the
same parts (shard h's parts to rank h): the same loss curve and the same weights, bit for bit.
Both sides compute each part's forward and backward from the same tensors (the parts are equal
tensor for tensor: tests/data/test_shard_parts.py) and sum the same two gradients, so no
tolerance is needed. Only the final scores differ in kind: across shards no host holds the
whole graph, so they are sampled inference's (as for the sampled strategy across shards).

Gossip: the pool across shards hands every subgraph out exactly once per epoch, a rank that
takes another host's subgraph fetches it, and what it fetches is the tensors its owner holds.

The ranks are forked from the test process, as in test_shard_sampled.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gnnpar.data.prepare_command import run_prepare
from gnnpar.runtime.launch import free_port
from tests.e2e.test_shard_sampled import _ranks

pytestmark = pytest.mark.slow

SEED = 3
EPOCHS = 2
PARTS = 6


@pytest.fixture(scope="module")
def cora2(tmp_path_factory):
    """(the folder holding both shards, [host h's folder: manifest + shard-h only])"""
    tmp = tmp_path_factory.mktemp("cora2")
    full = tmp / "full"
    run_prepare("cora", str(full), None, None, None, str(tmp / "root"), None, True,
                shards="2", partitioner="metis")  # fmt: skip
    hosts = []
    for s in range(2):
        g = tmp / f"host-{s}" / "g"
        g.mkdir(parents=True)
        shutil.copy(full / "manifest.json", g / "manifest.json")
        shutil.copytree(full / f"shard-{s}", g / f"shard-{s}")
        hosts.append(g)
    return full, hosts


def _train(h: int, world: int, folder: str, out: str, flags: dict) -> dict:
    from gnnpar.configure import build_config
    from gnnpar.run import prepare, run_rank

    base = {"model": "gcn", "hidden": "16", "layers": "2", "seed": str(SEED), "threads": "1"}
    base |= {"epochs": str(EPOCHS), "partitions": str(PARTS), "partitioner": "metis"}
    base |= {"quiet": True, "dataset": folder, "out": f"{out}-{h}", "timeout": "60"}
    cfg = build_config(None, base | flags)
    run_rank(cfg, prepare(cfg), direct=True)
    if h == 0:
        model = torch.load(f"{out}-0/model.pt", weights_only=False)
        return {"result": json.loads(open(f"{out}-0/result.json").read()), "model": model}
    return {}


@pytest.mark.timeout(120)
def test_allreduce_across_shards_trains_the_model_of_one_host_dealt_the_same_parts(tmp_path, cora2):
    full, hosts = cora2
    flags = {"strategy": "allreduce"}
    across = _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "a"), flags)[0]
    # one host with 2 ranks over the unsharded graph (the folder holding both shards)
    whole = _ranks(tmp_path, 2, _train, [full], str(tmp_path / "w"), flags, per_host=2)[0]
    a, w = across["result"], whole["result"]
    assert len(a["loss_curve"]) == EPOCHS
    assert a["loss_curve"] == w["loss_curve"]
    wa, ww = across["model"]["state_dict"], whole["model"]["state_dict"]
    assert wa.keys() == ww.keys()
    for k in wa:
        assert torch.equal(wa[k], ww[k]), k
    assert a["partitions"] == w["partitions"] == PARTS
    # scored without the whole graph: sampled inference over the shards
    assert a["eval_mode"] == "sampled" and 0 < a["val_score"] <= 1 and 0 < a["test_score"] <= 1
    assert w["eval_mode"] != "sampled"  # the one host scores over the whole graph


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("parts", "epochs"), [(PARTS, EPOCHS), (24, 3)])
def test_gossip_across_shards_trains_every_subgraph_once_per_epoch(tmp_path, cora2, parts, epochs):
    """(24, 3): many fetches, each a chance for the exchange a partner waits in to meet it (a
    blocking send of the fetched subgraph deadlocked there)."""
    _, hosts = cora2
    # rank 1 three times slower: rank 0 empties its own pool first, then takes from host 1's
    flags = {"strategy": "gossip", "slowdown": "1=3", "partitions": str(parts)}
    flags["epochs"] = str(epochs)
    got = _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "g"), flags)[0]["result"]
    logs = got["pool_log"]
    taken = sorted(tuple(t) for log in logs for t in log)
    assert taken == [(e, p) for e in range(epochs) for p in range(parts)]
    fetched, served = got["fetched_subgraphs"], got["served_subgraphs"]
    assert fetched[0] > 0 and fetched[0] + fetched[1] == served[0] + served[1]
    assert got["fetched_bytes"][0] > 0
    # each rank took from its own host's pool (parts 0-2 on host 0, 3-5 on host 1) first
    mine = [sum(1 for _, p in log if (p >= parts // 2) == (r == 1)) for r, log in enumerate(logs)]
    assert mine[0] + fetched[0] == len(logs[0]) and mine[1] + fetched[1] == len(logs[1])
    assert 0 < got["val_score"] <= 1 and got["eval_mode"] == "sampled"


def _fetch_one(h: int, world: int, folder: str, port: int) -> dict:
    """Rank 1 fetches each of host 0's subgraphs from rank 0 (serving while it waits)."""
    import torch.distributed as dist

    from gnnpar.data import shard_parts
    from gnnpar.data.sampling.distributed import ShardGraph
    from gnnpar.parallel.fetch import SubgraphFetch

    dist.init_process_group("gloo")
    graph = ShardGraph.open(folder, h)
    parts, first, sizes = shard_parts.host_parts(graph, h, PARTS, "metis", SEED)
    own = {first + i: b for i, b in enumerate(parts.batches())}
    store = dist.TCPStore("127.0.0.1", port, world, h == 0)  # the requests' store
    fetch = SubgraphFetch(store, "t", h, world, own, lambda p: 0 if p < sizes[0] else 1, 30)
    got = {}
    if h == 1:
        for p in range(sizes[0]):
            b = fetch[p]
            got[p] = {k: b[k] for k in ("x", "y", "edge_index", "n_id", "train_mask")}
    fetch.drain()
    if h == 0:
        got = {
            p: {k: own[p][k] for k in ("x", "y", "edge_index", "n_id", "train_mask")} for p in own
        }
    dist.destroy_process_group()
    return {"parts": got, "info": fetch.rank_info()}


@pytest.mark.timeout(60)
def test_a_fetched_subgraph_is_the_one_its_owner_holds(tmp_path, cora2):
    _, hosts = cora2
    owner, asker = _ranks(tmp_path, 2, _fetch_one, hosts, free_port())
    assert owner["info"]["served_subgraphs"] == asker["info"]["fetched_subgraphs"] == 3
    assert asker["info"]["fetched_bytes"] > 0
    assert owner["parts"].keys() == asker["parts"].keys()
    for p, want in owner["parts"].items():
        for k, t in want.items():
            assert torch.equal(asker["parts"][p][k], t), (p, k)


def _refused(h: int, world: int, folder: str, out: str, flags: dict) -> str:
    """The UsageError this rank ends with (the CLI prints it, exit 2)."""
    from gnnpar import UsageError

    try:
        _train(h, world, folder, out, flags)
    except UsageError as e:
        return str(e)
    return "trained"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("strategy", "damage"), [("allreduce", "missing"), ("gossip", "damaged")])
def test_a_host_whose_shard_is_missing_or_damaged_is_named_before_any_step(
    tmp_path, cora2, strategy, damage
):
    _, hosts = cora2
    bad = tmp_path / "bad" / "g"
    shutil.copytree(hosts[1], bad)
    if damage == "missing":
        shutil.rmtree(bad / "shard-1")
    else:
        f = bad / "shard-1" / "indices.npy"
        f.write_bytes(f.read_bytes()[:-8])
    out = str(tmp_path / "r")
    said = _ranks(tmp_path, 2, _refused, [hosts[0], bad], out, {"strategy": strategy})
    assert said[0] == said[1]  # the same words on both hosts
    assert said[0].startswith("host 1 (rank 1) cannot use its shard 1: "), said[0]
    assert ("is missing" if damage == "missing" else "indices.npy has") in said[0]
    assert not any((tmp_path / f"r-{h}" / "metrics.jsonl").exists() for h in range(2))


def _fetch_meets_exchange(h: int, world: int, folder: str, port: int) -> dict:
    """Rank 0 fetches one of host 1's subgraphs from rank 1 while rank 1 has picked rank 0 for
    a gossip exchange: rank 0 accepts the pick while it waits (its idle), so it sits in the
    exchange when rank 1 answers the fetch; rank 1 must go on to the exchange."""
    import random
    import time

    import torch.distributed as dist

    from gnnpar.data import shard_parts
    from gnnpar.data.sampling.distributed import ShardGraph
    from gnnpar.parallel.fetch import SubgraphFetch
    from gnnpar.parallel.gossip import AnyPeer, Pairing, exchange_average

    dist.init_process_group("gloo")
    graph = ShardGraph.open(folder, h)
    parts, first, sizes = shard_parts.host_parts(graph, h, PARTS, "metis", SEED)
    own = {first + i: b for i, b in enumerate(parts.batches())}
    store = dist.TCPStore("127.0.0.1", port, world, h == 0)
    fetch = SubgraphFetch(store, "t", h, world, own, lambda p: 0 if p < sizes[0] else 1, 30)
    pairing = Pairing(store, "g", AnyPeer(h, world), random.Random(h), 10)
    pairing.open()
    dist.barrier()
    weights = torch.full((4,), float(h))

    def exchange(x) -> None:  # noqa: ANN001
        exchange_average([weights], x.partner, 10, f"exchange {x.xid}")
        pairing.finish(x)

    def idle() -> None:
        x = pairing.at_boundary(want=False)
        if x is not None:
            exchange(x)

    def until(key: str, prefix: bytes) -> None:
        while not store.get(key).startswith(prefix):
            time.sleep(0.001)

    got = None
    if h == 1:
        assert pairing.at_boundary(want=True) is None  # picks rank 0
        until(pairing.key(0), b"ready")  # rank 0 accepted while waiting for its fetch
        assert fetch.serve() == 1  # answers that fetch, and goes on
        x = None
        while x is None:
            x = pairing.at_boundary(want=False)
        exchange(x)
    else:
        until(pairing.key(0), b"claim")
        fetch.idle = idle
        got = fetch[sizes[0]]  # host 1's first subgraph
    fetch.drain()
    dist.destroy_process_group()
    return {"weights": weights, "x": None if got is None else got.x, "own": own}


@pytest.mark.timeout(60)
def test_a_fetch_and_a_gossip_exchange_between_the_same_two_ranks_both_complete(tmp_path, cora2):
    _, hosts = cora2
    r0, r1 = _ranks(tmp_path, 2, _fetch_meets_exchange, hosts, free_port())
    assert torch.equal(r0["weights"], torch.full((4,), 0.5)) and torch.equal(
        r1["weights"], r0["weights"]
    )
    want = min(r1["own"])
    assert torch.equal(r0["x"], r1["own"][want].x)


# ------------------------------------------------- gossip across shards: checkpoints and resume
def _pool_taken(result: dict) -> list[tuple[int, int]]:
    return sorted(tuple(t) for log in result["pool_log"] for t in log)


@pytest.mark.timeout(180)
def test_gossip_across_shards_resumed_from_a_checkpoint_equals_the_uninterrupted_run(
    tmp_path, cora2
):
    """Gossip made deterministic: one part per host, so between two epochs' checkpoints each
    rank takes its own host's part (own pool first; each rank takes its next epoch's part
    before the checkpoint's barrier, so neither can steal it), and no exchange (--sync-every
    beyond the run's steps). Both ranks sleep 9x their step's compute after each step
    (--slowdown: no arithmetic changes), so that neither can come back for another part before
    the other has taken its own first one, however late it starts. Run "b"
    stops after 2 of 3 epochs (its checkpoint of epoch 1 kept) and resumes: the same loss
    curve and final model, bit for bit, as run "a", which ran the 3 epochs at once."""
    _, hosts = cora2
    flags = {"strategy": "gossip", "partitions": "2", "sync-every": "1000", "epochs": "3"}
    flags |= {"checkpoint-every": "1", "slowdown": "0=10,1=10"}
    a = _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "a"), flags)[0]
    _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "b"), flags | {"epochs": "2"})
    for h in range(2):  # each host holds its own rank's parts only
        names = [p.name for p in (tmp_path / f"b-{h}" / "checkpoints").iterdir()]
        assert names == ["epoch-000001-step-00000000"], names
        assert [p.name for p in (tmp_path / f"b-{h}/checkpoints" / names[0]).glob("*.pt")] == [
            f"rank{h}.pt"
        ]
    b = _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "b"), flags | {"resume": True})[0]
    ra, rb = a["result"], b["result"]
    assert rb["resumed_from"].endswith("epoch-000001-step-00000000")
    # the premise: each rank trained its own host's part (0 on host 0, 1 on host 1) each epoch
    for r in (ra, rb):
        assert r["pool_log"] == [[[e, h] for e in range(3)] for h in range(2)], r["pool_log"]
        assert r["fetched_subgraphs"] == [0, 0]
    assert len(rb["loss_curve"]) == 3 and rb["loss_curve"] == ra["loss_curve"]
    wa, wb = a["model"]["state_dict"], b["model"]["state_dict"]
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert rb["val_score"] == ra["val_score"] and rb["final_model"] == ra["final_model"]


@pytest.mark.timeout(180)
def test_allreduce_across_shards_resumed_from_a_checkpoint_equals_the_uninterrupted_run(
    tmp_path, cora2
):
    _, hosts = cora2
    flags = {"strategy": "allreduce", "epochs": "4", "checkpoint-every": "1"}
    a = _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "a"), flags)[0]
    _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "b"), flags | {"epochs": "2"})
    b = _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "b"), flags | {"resume": True})[0]
    ra, rb = a["result"], b["result"]
    assert rb["resumed_from"].endswith("epoch-000001-step-00000000")
    assert len(rb["loss_curve"]) == 4 and rb["loss_curve"] == ra["loss_curve"]
    wa, wb = a["model"]["state_dict"], b["model"]["state_dict"]
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.mark.timeout(180)
def test_gossip_across_shards_with_fetches_and_exchanges_resumes_training_each_subgraph_once(
    tmp_path, cora2
):
    """Not deterministic (which rank takes what, and who pairs when, depend on timing): rank
    1 slowed 3x, so rank 0 fetches host 1's parts every epoch, checkpoints every epoch, the
    run stopped after 2 of 5 epochs and resumed. Across the two attempts every subgraph of every
    epoch is trained exactly once, with fetches and exchanges in each."""
    _, hosts = cora2
    flags = {"strategy": "gossip", "partitions": "12", "slowdown": "1=3", "sync-every": "1"}
    flags |= {"checkpoint-every": "1", "epochs": "2"}
    first = _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "b"), flags)[0]["result"]
    assert first["fetched_subgraphs"][0] > 0 and sum(first["per_worker_exchanges"]) > 0
    flags |= {"epochs": "5", "resume": True}
    got = _ranks(tmp_path, 2, _train, hosts, str(tmp_path / "b"), flags)[0]["result"]
    assert got["resumed_from"].endswith("epoch-000001-step-00000000")
    assert _pool_taken(got) == [(e, p) for e in range(5) for p in range(12)]
    # the resumed attempt's own fetches (the counts are this attempt's)
    fetched, served = got["fetched_subgraphs"], got["served_subgraphs"]
    assert fetched[0] > 0 and sum(fetched) == sum(served)
    assert len(got["loss_curve"]) == 5 and all(x == x for x in got["loss_curve"])


def _killed_under_torchrun(tmp_path, hosts: list, flags: list, steps: int) -> tuple:  # noqa: ANN001
    """Two hosts under `gnnpar torchrun --max-restarts 2`, each agent with its own folder (the
    manifest and its shard) and its own --out, numbered by --local-addr (127.0.0.1 is node rank
    0, so holds shard 0; 127.0.0.2 node rank 1); rank 1 killed with SIGKILL once rank 0 has
    trained ``steps`` steps. Both agents must end well: (rank 0's result.json, the outs)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers import ROOT, wait_for_steps
    from tests.training.test_checkpoint import torchrun_rank_pid

    port, procs, outs = free_port(), [], [tmp_path / "h0", tmp_path / "h1"]
    for h, out in enumerate(outs):
        cmd = [sys.executable, "-m", "gnnpar", "torchrun", "--nnodes", "2"]
        cmd += ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--max-restarts", "2"]
        cmd += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "shards"]
        cmd += ["--rdzv-conf", "is_host=true" if h == 0 else "is_host=false"]
        cmd += ["--local-addr", f"127.0.0.{h + 1}", "train", "--dataset", str(hosts[h])]
        cmd += [*flags, "--timeout", "5", "--eval-every", "0", "--quiet", "--out", str(out)]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        )  # fmt: skip
    try:
        wait_for_steps(outs[0] / "metrics.jsonl", steps, procs[0], deadline_s=120)
        os.kill(torchrun_rank_pid(procs[1].pid, 1), signal.SIGKILL)  # dies without a word
        t0 = time.monotonic()
        errs = [p.communicate(timeout=180)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    assert time.monotonic() - t0 < 120
    assert "Traceback" not in errs[0] + errs[1]
    r = json.loads((outs[0] / "result.json").read_text())
    assert r["restarts"] >= 1 and r["resumed_from"], r  # restarted, and resumed
    for h, out in enumerate(outs):  # each host holds its own rank's checkpoint parts only
        held = {p.name for p in out.glob("checkpoints/*/rank*.pt")}
        assert held == {f"rank{h}.pt"}, held
    return r, outs


@pytest.mark.timeout(240)
def test_a_rank_killed_on_a_sharded_gossip_run_is_restarted_and_every_subgraph_trained_once(
    tmp_path, cora2
):
    """Rank 1 (slowed 2x, so that rank 0 fetches host 1's parts) killed mid-run: the agents
    restart both ranks, which resume from the newest checkpoint both hold and finish; every
    subgraph of every epoch is trained exactly once across the attempts."""
    _, hosts = cora2
    epochs, parts = 16, 12
    flags = ["--strategy", "gossip", "--model", "gcn", "--hidden", "16", "--seed", str(SEED)]
    flags += ["--partitions", str(parts), "--epochs", str(epochs), "--threads", "1"]
    flags += ["--checkpoint-every", "1", "--slowdown", "1=2"]
    r, _ = _killed_under_torchrun(tmp_path, hosts, flags, 3 * parts // 2)
    assert r["epochs"] == epochs
    assert _pool_taken(r) == [(e, p) for e in range(epochs) for p in range(parts)]
    assert 0 < r["val_score"] <= 1 and r["eval_mode"] == "sampled"


@pytest.mark.timeout(240)
def test_a_rank_killed_on_a_sampled_run_across_shards_ends_as_the_uninterrupted_run(
    tmp_path, cora2
):
    """Sampled training across shards, checkpointed every 3 steps (5 steps an epoch), rank 1
    killed mid-run under --max-restarts: the restarted ranks resume and end with the loss
    curve and weights of the same run uninterrupted (forked ranks, as in
    test_shard_sampled.py), bit for bit."""
    from tests.e2e.test_shard_sampled import _train_model

    _, hosts = cora2
    same = {"epochs": "8", "batch-size": "16"}
    ref = _ranks(tmp_path, 2, _train_model, hosts, str(tmp_path / "ref"), same)[0]
    assert ref["result"]["steps_per_epoch"] == 5
    flags = ["--strategy", "sampled", "--model", "sage", "--hidden", "16", "--layers", "2"]
    flags += ["--fanouts", "5,5", "--batch-size", "16", "--seed", "3", "--epochs", "8"]
    flags += ["--threads", "1", "--checkpoint-every-steps", "3"]
    r, outs = _killed_under_torchrun(tmp_path, hosts, flags, 12)
    assert r["loss_curve"] == ref["result"]["loss_curve"]
    weights = torch.load(outs[0] / "model.pt")["state_dict"]
    assert weights.keys() == ref["weights"].keys()
    for k in weights:
        assert torch.equal(weights[k], ref["weights"][k]), k
