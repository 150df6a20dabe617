"""Sampled training across shards (gnnpar.data.sampling.distributed): H hosts, each a real
process of a gloo group whose folder holds only the top manifest and its own shard, sample the
mini-batches one host samples over the unsharded graph (the same seeds, the same n_id by
original id, the same edges, features and labels) and train the same loss curve, bit for bit, as
H ranks over the whole graph.

The ranks are forked from the test process (no interpreter start, no torch import: the test
costs a few seconds) and join the group through torch.distributed's env:// rendezvous on
localhost, as the hosts of ``torchrun --nnodes H`` do (GROUP_RANK picks the shard)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import sys
import traceback

import pytest
import torch

from gnnpar.data.prepare_command import run_prepare
from gnnpar.runtime.launch import free_port

pytestmark = pytest.mark.slow

FANOUTS = [5, 5]
BATCH = 64
EVAL_BATCH = 400  # few evaluation batches: each is a round of exchanges
SEED = 3
EPOCHS = 2


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """{H: (the folder holding every shard, [host h's folder: manifest + shard-h only])}"""
    tmp = tmp_path_factory.mktemp("sharded")
    got = {}
    for h, method in ((2, "metis"), (3, "stream")):
        full = tmp / f"full-{h}"
        run_prepare("cora", str(full), None, None, None, str(tmp / "root"), None, True,
                    shards=str(h), partitioner=method)  # fmt: skip
        hosts = []
        for s in range(h):
            g = tmp / f"{h}-host-{s}" / "g"
            g.mkdir(parents=True)
            shutil.copy(full / "manifest.json", g / "manifest.json")
            shutil.copytree(full / f"shard-{s}", g / f"shard-{s}")
            hosts.append(g)
        got[h] = (full, hosts)
    return got


def _env(rank: int, world: int, port: int, per_host: int) -> None:
    """torchrun's variables for global rank ``rank``, ``per_host`` ranks on each host."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_host),
        LOCAL_WORLD_SIZE=str(per_host), GROUP_RANK=str(rank // per_host),
        GROUP_WORLD_SIZE=str(world // per_host), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        del os.environ[k]
    torch.set_num_threads(1)


def _child(fn, h: int, world: int, port: int, per: int, out: str, *args) -> None:  # noqa: ANN001
    """A forked rank: run ``fn``, write what it returns (or its error) to ``out``."""
    try:
        _env(h, world, port, per)
        torch.save({"ok": fn(h, world, *args)}, out)
    except BaseException:  # noqa: BLE001 (said to the test)
        torch.save({"error": traceback.format_exc()}, out)
    finally:
        os._exit(0)


def _ranks(tmp_path, world: int, fn, folders: list, *args, per_host: int = 1) -> list:  # noqa: ANN001
    """``fn(rank, world, folders[rank // per_host], *args)`` in ``world`` forked ranks,
    ``per_host`` on each host; what each returned."""
    ctx = mp.get_context("fork")  # the ranks start in milliseconds: no interpreter, no imports
    port = free_port()
    outs = [str(tmp_path / f"rank-{fn.__name__}-{h}.pt") for h in range(world)]
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, h, world, port, per_host, outs[h], str(folders[h // per_host]), *args),
        )
        for h in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    for p in procs:
        if p.is_alive():
            p.kill()
    got = [torch.load(o, weights_only=False) for o in outs]
    for g in got:
        assert "ok" in g, g.get("error")
    return [g["ok"] for g in got]


def _sharded_batches(h: int, world: int, folder: str, cache: int, block: int | None) -> list:
    """Every batch of this rank's two epochs, sampled across shards, ids made original; the
    feature rows exchanged in rounds of ``block`` rows per peer where given."""
    import torch.distributed as dist

    from gnnpar.data.sampling import distributed as shard
    from gnnpar.data.sampling.loader import shard_plan

    dist.init_process_group("gloo")
    host = int(os.environ["GROUP_RANK"])
    graph = shard.ShardGraph.open(folder, host)
    ex = shard.Exchange(graph.bounds, host)
    train_idx, train_y = shard.gather_train(graph)
    _, steps = shard_plan(train_idx.numel(), world, BATCH)
    sampler = shard.ShardSampler(graph, ex, FANOUTS)
    sampler.block_rows = block
    if cache:  # the remote rows sampled most, held: the same batches, fewer rows asked for
        assert sampler.cache_hot_rows(cache, train_idx, BATCH) == cache
        ex.bytes_sent = ex.bytes_needed = 0
    batches = shard.ShardBatches(sampler, train_idx, train_y, BATCH, h, world, SEED, steps)
    # the original id of every node, gathered (for the comparison only: training never needs it)
    every = [torch.empty(graph.num_nodes, dtype=torch.long) for _ in range(world)]
    mine = torch.full((graph.num_nodes,), -1, dtype=torch.long)
    mine[graph.first : graph.end] = graph.orig_ids
    dist.all_gather(every, mine)
    orig = torch.stack(every).max(0).values
    out = []
    for i in range(EPOCHS * steps):
        b = batches[i]
        out.append((orig[b.n_id], b.edge_index, b.x, b.y, b.batch_size))
    sent, needed = ex.bytes_sent, ex.bytes_needed
    hits = getattr(sampler, "cache_hits", 0)
    held = orig[sampler.slot >= 0] if cache else orig[:0]
    own = graph.orig_ids.long().clone()
    model = _model().eval()
    scores = shard.evaluate_across(lambda b: model(b.x, b.edge_index), sampler, EVAL_BATCH, False)
    dist.destroy_process_group()
    return out, sent, needed, hits, scores, held, own


def _model():  # noqa: ANN202
    """The same weights in every process (a fixed seed)."""
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(0)
    return GraphSAGE(1433, 16, len(FANOUTS), 7)


def _reference_scores(full, hosts: int, per_host: int, d) -> dict:  # noqa: ANN001
    """What evaluate_across must find: each rank's share of its host's val and test nodes, in
    batches of EVAL_BATCH, sampled over the unsharded graph with batch i's generator seeded i."""
    from gnnpar.data import shards
    from gnnpar.data.sampling.sampler import CSRGraph, NeighborSampler

    parts = shards.open_shards(full)
    orig = torch.cat([torch.from_numpy(p.array("orig_ids").copy()) for p in parts])
    sampler = NeighborSampler(CSRGraph.from_edge_index(d.edge_index, d.num_nodes), FANOUTS)
    model = _model().eval()
    right, total = {"val": 0, "test": 0}, {"val": 0, "test": 0}
    for r in range(hosts * per_host):
        p, place = parts[r // per_host], r % per_host
        ids = [torch.from_numpy(p.array(sp).copy())[place::per_host] for sp in ("val", "test")]
        tags = ["val"] * ids[0].numel() + ["test"] * ids[1].numel()
        seeds_all = orig[torch.cat(ids)]
        for i in range(-(-seeds_all.numel() // EVAL_BATCH)):
            seeds = seeds_all[i * EVAL_BATCH : (i + 1) * EVAL_BATCH]
            b = sampler.sample(seeds, torch.Generator().manual_seed(i))
            with torch.no_grad():
                hit = model(d.x[b.n_id], b.edge_index)[: seeds.numel()].argmax(-1) == d.y[seeds]
            for t, h in zip(tags[i * EVAL_BATCH : (i + 1) * EVAL_BATCH], hit.tolist(), strict=True):
                right[t] += int(h)
                total[t] += 1
    return {t: right[t] / total[t] for t in right}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("hosts", "per_host", "cache", "block"), [(2, 1, 0, None), (3, 1, 300, 50), (2, 2, 200, 7)]
)
def test_shards_sample_the_batches_of_one_host_over_the_whole_graph(
    tmp_path, sharded, hosts, per_host, cache, block
):
    from gnnpar.data.sampling.loader import SampledBatches, save_shared_graph, shard_plan
    from gnnpar.data.sampling.sampler import CSRGraph
    from gnnpar.data.shards import load_sharded

    full, folders = sharded[hosts]
    world = hosts * per_host  # several ranks per host share its shard and answer for it
    got = _ranks(tmp_path, world, _sharded_batches, folders, cache, block, per_host=per_host)
    # one host over the unsharded graph (original ids), as the sampled strategy samples it
    ds = load_sharded(full)
    d = ds.data
    path = str(tmp_path / "graph.pt")
    save_shared_graph(path, CSRGraph.from_edge_index(d.edge_index, d.num_nodes), d.x, d.y)
    train_idx = d.train_mask.nonzero().view(-1)
    _, steps = shard_plan(train_idx.numel(), world, BATCH)
    for r in range(world):
        ref = SampledBatches(path, train_idx, FANOUTS, BATCH, r, world, SEED, steps)
        batches, sent, needed, hits, scores, held, own = got[r]
        assert scores == got[0][4]  # every rank returns the summed scores
        assert len(batches) == EPOCHS * steps and sent > 0
        assert (hits > 0) == (cache > 0)  # held rows were used, not asked for
        for i, (n_id, edge_index, x, y, k) in enumerate(batches):
            want = ref[i]
            assert k == want.batch_size
            assert torch.equal(n_id, want.n_id), (r, i)
            assert torch.equal(edge_index, want.edge_index), (r, i)
            assert torch.equal(x, want.x) and torch.equal(y, want.y), (r, i)
    if cache:  # the remote rows held: those of most expected visits over the whole graph
        from gnnpar.data.sampling.sampler import CSRGraph as Csr
        from gnnpar.data.visits import expected_visits

        csr = Csr.from_edge_index(d.edge_index, d.num_nodes)
        ptr, col = csr.rowptr.numpy(), csr.col.numpy()  # cora: undirected, a symmetric CSR
        score = expected_visits(ptr, col, train_idx.numpy(), FANOUTS, BATCH, symmetric=True)
        for r in range(world):
            held, own = got[r][5], got[r][6]
            other = torch.ones(d.num_nodes, dtype=torch.bool)
            other[held] = other[own] = False
            assert held.numel() == cache and not bool(torch.isin(held, own).any())
            assert score[held.numpy()].min() >= score[other.numpy()].max()
    # the final evaluation across shards: sampled inference, the batches of one host
    want = _reference_scores(full, hosts, per_host, d)
    assert got[0][4] == {"val": want["val"], "test": want["test"], "train": None}
    # what crossed between hosts: within the framing (counts, seeds, split sizes) of the least
    total_sent = sum(g[1] for g in got)
    total_needed = sum(g[2] for g in got)
    assert total_needed <= total_sent <= 1.2 * total_needed, (total_sent, total_needed)
    if cache == 0 and block is None:  # gnnpar advise's model of those bytes, from the frontiers
        from gnnpar.advise.shard_exchange import traffic

        predicted = 0.0
        for r in range(world):
            ref = SampledBatches(path, train_idx, FANOUTS, BATCH, r, world, SEED, steps)
            for i in range(EPOCHS * steps):
                b = ref[i]
                nodes, edges = b.num_sampled_nodes, b.num_sampled_edges
                t = traffic(nodes, edges, 4 * d.x.size(1), hosts, per_host, 0.0)
                predicted += t.bytes_sent
        # cora, 2 hosts: 7.53 MB predicted against 7.87 MB sent (0.96)
        assert 0.8 * total_sent <= predicted <= 1.2 * total_sent, (predicted, total_sent)


def _train(
    h: int, world: int, folder: str, out: str, limit: str | None = None, more: dict | None = None
) -> dict | None:
    """One rank of the run; ``limit``: the memory it may use (GNNPAR_MEMORY_LIMIT, as a cgroup's
    limit: across shards the feature exchange then runs in rounds bounded by it)."""
    from gnnpar.configure import build_config
    from gnnpar.run import prepare, run_rank

    if limit:
        os.environ["GNNPAR_MEMORY_LIMIT"] = limit

    flags = {"model": "sage", "hidden": "16", "layers": "2", "seed": str(SEED), "threads": "1"}
    flags |= {"strategy": "sampled", "epochs": str(EPOCHS), "batch-size": str(BATCH)}
    flags |= {"fanouts": ",".join(map(str, FANOUTS)), "quiet": True, "dataset": folder}
    flags |= {"out": f"{out}-{h}", "timeout": "60"} | (more or {})
    cfg = build_config(None, flags)
    run_rank(cfg, prepare(cfg), direct=True)
    if h == 0:
        return json.loads((open(f"{out}-0/result.json")).read())
    return None


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("hosts", "limit"), [(2, None), (3, "48M")])
def test_shards_train_the_loss_curve_of_the_whole_graph(tmp_path, sharded, hosts, limit):
    full, folders = sharded[hosts]
    # 48M: the least block, 256 feature rows per peer a round: most steps take 2 rounds
    across = _ranks(tmp_path, hosts, _train, folders, str(tmp_path / "a"), limit)[0]
    # the same ranks, each host holding every shard: each trains on the whole graph
    whole = _ranks(tmp_path, hosts, _train, [full] * hosts, str(tmp_path / "w"))[0]
    assert len(across["loss_curve"]) == EPOCHS
    assert across["loss_curve"] == whole["loss_curve"]
    # without a limit batch i+1 is made on a thread (its exchanges on a group of their own)
    # while batch i trains; in 48M one batch more does not fit: made in line. Same curve.
    assert across["exchange_ahead"] == [limit is None] * hosts
    assert all(t > 0 for t in across["batch_make_s_per_step"])
    # the final scores: sampled inference across shards (equal to one host's: the batch test)
    assert 0 < across["val_score"] <= 1 and 0 < across["test_score"] <= 1
    assert across["train_score"] is None  # not computed across shards (its cost)
    sent = across["exchange_bytes_per_step"]
    needed = across["exchange_needed_bytes_per_step"]
    assert len(sent) == hosts and all(s > 0 for s in sent)
    assert sum(needed) <= sum(sent) <= 1.2 * sum(needed)
    assert "exchange_bytes_per_step" not in whole


def _train_model(h: int, world: int, folder: str, out: str, flags: dict) -> dict | None:
    """:func:`_train` with more flags; rank 0 returns result.json and model.pt's weights."""
    from gnnpar.configure import build_config
    from gnnpar.run import prepare, run_rank

    base = {"model": "sage", "hidden": "16", "layers": "2", "seed": str(SEED), "threads": "1"}
    base |= {"strategy": "sampled", "epochs": str(EPOCHS), "batch-size": str(BATCH)}
    base |= {"fanouts": ",".join(map(str, FANOUTS)), "quiet": True, "dataset": folder}
    base |= {"out": f"{out}-{h}", "timeout": "60", "eval-every": "0"}
    cfg = build_config(None, base | flags)
    run_rank(cfg, prepare(cfg), direct=True)
    if h == 0:
        result = json.loads((open(f"{out}-0/result.json")).read())
        return {"result": result, "weights": torch.load(f"{out}-0/model.pt")["state_dict"]}
    return None


@pytest.mark.timeout(300)
def test_shards_resumed_midway_from_a_step_checkpoint_train_the_uninterrupted_run(
    tmp_path, sharded
):
    """Two hosts, each holding only its shard, checkpoint every 3 steps (2 steps an epoch here:
    the checkpoint of step 3 is in the middle of epoch 1). A run of 2 of 3 epochs, resumed
    from it, ends with the 3-epoch run's loss curve and weights, bit for bit: a batch is made
    from (seed, epoch, rank, step) alone, across shards as on one host."""
    _, folders = sharded[2]
    a = _ranks(tmp_path, 2, _train_model, folders, str(tmp_path / "a"), {"epochs": "3"})[0]
    flags = {"epochs": "2", "checkpoint-every-steps": "3"}
    _ranks(tmp_path, 2, _train_model, folders, str(tmp_path / "b"), flags)
    for h in range(2):  # each host holds its own rank's part of the mid-epoch checkpoint
        held = (tmp_path / f"b-{h}/checkpoints/epoch-000001-step-00000001").glob("rank*.pt")
        assert [p.name for p in held] == [f"rank{h}.pt"]
    flags |= {"epochs": "3", "resume": True}
    b = _ranks(tmp_path, 2, _train_model, folders, str(tmp_path / "b"), flags)[0]
    ra, rb = a["result"], b["result"]
    assert ra["steps_per_epoch"] == 2 and len(ra["loss_curve"]) == 3
    assert rb["resumed_from"].endswith("epoch-000001-step-00000001")
    assert ra["exchange_ahead"] == rb["exchange_ahead"] == [True, True]  # made on a thread
    assert rb["loss_curve"] == ra["loss_curve"]
    assert a["weights"].keys() == b["weights"].keys()
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k
    assert rb["val_score"] == ra["val_score"] and rb["test_score"] == ra["test_score"]


def _local_deal(h: int, world: int, folder: str) -> tuple:
    """This rank's seeds (sharded ids) of every batch of EPOCHS epochs under --seeds local, the
    shards' bounds, every training node and the steps per epoch."""
    import torch.distributed as dist

    from gnnpar.data.sampling import distributed as shard
    from gnnpar.data.sampling.loader import shard_plan

    dist.init_process_group("gloo")
    graph = shard.ShardGraph.open(folder, int(os.environ["GROUP_RANK"]))
    ex = shard.Exchange(graph.bounds, int(os.environ["GROUP_RANK"]))
    train_idx, train_y = shard.gather_train(graph)
    _, steps = shard_plan(train_idx.numel(), world, BATCH)
    sampler = shard.ShardSampler(graph, ex, FANOUTS)
    batches = shard.ShardBatches(
        sampler, train_idx, train_y, BATCH, h, world, SEED, steps, seeds="local"
    )
    seeds = []
    for i in range(EPOCHS * steps):
        b = batches[i]
        seeds.append(b.n_id[: b.batch_size].clone())
    dist.destroy_process_group()
    return seeds, graph.bounds, train_idx, steps


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("hosts", "per_host"), [(2, 1), (2, 2)])
def test_seeds_local_deals_every_training_node_once_per_epoch_from_its_hosts_shard(
    tmp_path, sharded, hosts, per_host
):
    _, folders = sharded[hosts]
    world = hosts * per_host
    got = _ranks(tmp_path, world, _local_deal, folders, per_host=per_host)
    bounds, train_idx, steps = got[0][1], got[0][2], got[0][3]
    owner = torch.searchsorted(bounds[1:], train_idx, right=True)
    per_rank = train_idx.numel() // world
    for epoch in range(EPOCHS):
        mine = [torch.cat(g[0][epoch * steps : (epoch + 1) * steps]) for g in got]
        assert all(len(g[0]) == EPOCHS * steps for g in got)  # equal steps on every rank
        every = torch.cat(mine)
        assert every.unique().numel() == every.numel()  # no node twice in an epoch
        assert every.numel() == train_idx.numel() - train_idx.numel() % world
        assert set(every.tolist()) <= set(train_idx.tolist())
        for h in range(hosts):  # a host's own nodes first, as many as its ranks take
            m = torch.cat(mine[h * per_host : (h + 1) * per_host])
            own = int((torch.searchsorted(bounds[1:], m, right=True) == h).sum())
            assert own == min(per_host * per_rank, int((owner == h).sum())), (epoch, h)


def test_seeds_local_trains_the_same_curve_twice_and_sends_fewer_bytes(tmp_path, sharded):
    _, folders = sharded[2]
    flags = {"seeds": "local", "eval-every": "0"}
    a = _ranks(tmp_path, 2, _train, folders, str(tmp_path / "a"), None, flags)[0]
    b = _ranks(tmp_path, 2, _train, folders, str(tmp_path / "b"), None, flags)[0]
    g = _ranks(tmp_path, 2, _train, folders, str(tmp_path / "g"), None)[0]
    assert a["seeds"] == "local" and g["seeds"] == "global"
    assert len(a["loss_curve"]) == EPOCHS and a["loss_curve"] == b["loss_curve"]
    assert a["steps_per_epoch"] == g["steps_per_epoch"]
    assert a["loss_curve"] != g["loss_curve"]  # other batches
    # METIS shards: most of a host's seeds and their neighbours are its own
    assert sum(a["exchange_bytes_per_step"]) < sum(g["exchange_bytes_per_step"])


STALL_TIMEOUT = 6  # --timeout of the stalled run: its heartbeat names a peer after 0.9 x that


def _stallable(h: int, world: int, port: int, folder: str, out: str, err: str) -> None:
    """A forked rank training across shards for many epochs (batches made ahead on a thread);
    its stderr to ``err``."""
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    sys.stderr = os.fdopen(2, "w", buffering=1)  # not pytest's capture, inherited by the fork
    try:
        _env(h, world, port, 1)
        _train(h, world, folder, out, None, {"epochs": "5000", "timeout": str(STALL_TIMEOUT)})
    except BaseException:  # noqa: BLE001 (said to the test)
        traceback.print_exc()
        os._exit(3)
    os._exit(0)


@pytest.mark.timeout(120)
def test_a_stopped_host_is_named_within_the_timeout_while_batches_are_made_ahead(tmp_path, sharded):
    """Host 1 is stopped (SIGSTOP) while both train across shards, host 0's thread making its
    next batch in the exchange (on a group of its own): host 0's heartbeat names rank 1 within
    1.2 x --timeout and the run ends with exit 1, no wait in the thread's collectives."""
    import signal
    import time

    _, folders = sharded[2]
    ctx = mp.get_context("fork")
    port = free_port()
    out, errs = str(tmp_path / "s"), [str(tmp_path / f"err-{h}") for h in range(2)]
    procs = [
        ctx.Process(target=_stallable, args=(h, 2, port, str(folders[h]), out, errs[h]))
        for h in range(2)
    ]
    for p in procs:
        p.start()
    try:
        metrics, t0 = tmp_path / "s-0" / "metrics.jsonl", time.monotonic()
        while time.monotonic() - t0 < 60:  # until it trains
            steps = metrics.read_text().count('"event": "step"') if metrics.exists() else 0
            if steps >= 4 or not procs[0].is_alive():
                break
            time.sleep(0.05)
        assert procs[0].is_alive(), open(errs[0]).read()[-2000:]
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        procs[0].join(4 * STALL_TIMEOUT)
        took = time.monotonic() - stopped
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
    err = open(errs[0]).read()
    assert procs[0].exitcode == 1, err[-2000:]
    assert "rank 1 (host" in err and "stopped answering" in err, err[-2000:]
    assert took <= 1.2 * STALL_TIMEOUT + 2, took  # + the exit itself on a loaded machine
