"""``gnnpar advise`` never ends in a traceback: a hand-made tiny graph, a KarateClub-like one and
Cora x hosts {1, 2, 16, 64} x ranks per host {1, 4} x every strategy (each alone, and all of
them) x with and without stragglers end in advice or in one message (exit 2).

Quick lane: the request, its grid fitted to the graph (:mod:`gnnpar.advise.fit`, on the graph's
real partitions) and the simulation of every configuration left, from a profile made here for
that grid (round numbers, each step scaled by its batch's nodes: what is checked is that every
shape of cluster can be predicted, not how fast; the profile passes the same check as a saved
one, :func:`gnnpar.advise.command.check_profile`). Slow lane: the same with the profile taken
for real, in ``gnnpar advise`` processes (the README's 16-host example among them).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch_geometric.data import Data

from gnnpar import UsageError
from gnnpar.advise import report
from gnnpar.advise.command import _load_dataset, check_profile, fit_request, parse_request
from gnnpar.advise.fit import graph_facts
from gnnpar.advise.predict import ALL, predict, recommend
from gnnpar.advise.profile import Profile, flags_for, profile_graph_batches, seed_batch_sizes
from gnnpar.cli import main
from helpers import run_cli

HOSTS = (1, 2, 16, 64)


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


RANKS_PER_HOST = (1, 4)


def tiny_graph() -> Data:
    """12 nodes in two rings of 6 joined by one edge, 2 classes, no masks (gnnpar splits it)."""
    ring = [(i, (i + 1) % 6) for i in range(6)] + [(6 + i, 6 + (i + 1) % 6) for i in range(6)]
    edges = ring + [(0, 6)]
    src = [a for a, b in edges] + [b for a, b in edges]
    dst = [b for a, b in edges] + [a for a, b in edges]
    g = torch.Generator().manual_seed(0)
    y = torch.tensor([0] * 6 + [1] * 6)
    x = torch.randn(12, 4, generator=g) + y[:, None].float()
    return Data(x=x, edge_index=torch.tensor([src, dst]), y=y)


def karate_like() -> Data:
    """KarateClub as PyG ships it (34 nodes, 4 classes): its train mask of 4 nodes kept, the
    rest split for validation and test."""
    from torch_geometric.datasets import KarateClub

    return KarateClub()[0]


def readme_graph() -> Data:
    """What the README's "Train on your own graph" saves to my_graph.pt: KarateClub without
    its train mask (gnnpar splits it 60/20/20: 20 training nodes)."""
    data = karate_like()
    del data.train_mask
    return data


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """name -> its --dataset: the two user graphs saved as .pt files, and Cora."""
    tmp = tmp_path_factory.mktemp("graphs")
    out = {"cora": "cora"}
    for name, make in (("tiny", tiny_graph), ("karate", karate_like), ("readme", readme_graph)):
        torch.save(make(), tmp / f"{name}.pt")
        out[name] = str(tmp / f"{name}.pt")
    return out


def cluster_flags(hosts: int, per_host: int, stragglers: bool) -> dict:
    """The cluster's flags; the averaging period is fixed (K = 20 without stragglers, 1 with):
    it changes no shape of the grid, and halves the simulations."""
    flags: dict = {"hosts": hosts, "ranks_per_host": per_host}
    flags["sync_every"] = 1 if stragglers else 20
    if hosts > 1:
        flags["network"] = "10gbit,50us"
    if stragglers:  # the README's --slowdown 3=3 where the cluster has a rank 3, and jitter
        flags["slowdown"] = f"{min(3, hosts * per_host - 1)}=3"
        flags["jitter"] = 0.5
    return flags


def made_profile(req, needs, ds) -> Profile:
    """A profile holding every batch kind of ``needs`` for the graph ``ds``: each step's time
    grows with its batch's nodes, the rest round numbers, gloo's costs as measured on a 2-core
    machine; with the straggler probes' factors."""
    n, train = ds.num_nodes, int(ds.data.train_mask.sum())

    def step(nodes: float) -> float:
        return 2e-4 + 2e-7 * nodes

    prof = Profile(
        machine="sweep", cores=2, threads=req.threads, dataset=req.dataset, model=req.model,
        epochs=req.epochs, seed=0, num_nodes=n, num_train=train, param_bytes=100_000,
        base_rss_bytes=100 << 20, loop_step_s=1e-4, loop_factor=1.1, slowed_share=0.8,
    )  # fmt: skip
    chunks = set()
    for need in needs:
        if need.kind == "full":
            prof.full_step_s, prof.full_first_s = step(n), 1e-3
            prof.memory["full"] = {"model": 1 << 20}
        elif need.kind == "parts":
            p = need.partitions
            prof.parts_step_s[str(p)] = [step(n / p) * (1 + 0.1 * (i % 3)) for i in range(p)]
            prof.parts_first_s[str(p)] = [1e-4] * p
            prof.memory[f"parts{p}"] = {"model": 1 << 20}
            prof.after_pause[f"parts{p}"] = 1.4
            prof.beside_straggler[f"parts{p}"] = 1.2
        elif need.kind == "pipeline":
            chunks.add(need.chunks)
    sampled = [nd for nd in needs if nd.kind == "sampled"]
    for b in seed_batch_sizes(sampled, train):
        seeds = min(b, train)
        prof.sampled[str(b)] = {
            "sample_s": 1e-3, "main_sample_s": 1.2e-3, "compute_s": step(10 * seeds),
            "first_batch_s": 1e-3, "slowed_share": 0.8, "fanouts": [10, 10],
            "worker_s": 2e-3, "recv_s": 3e-4, "compute_recv_s": step(10 * seeds) * 1.1,
        }  # fmt: skip
        prof.memory[f"sampled{b}"] = {"model": 1 << 20}
        prof.after_pause[f"sampled{b}"] = 1.3
    comm = any(c.world > 1 for c in req.grid)
    shapes = {(nd.replicas, nd.stages, nd.chunks) for nd in needs if nd.kind == "pipeline"}
    if comm:  # the two-stage shapes whose real step calibrates every pipeline's
        shapes |= {(1, 2, m) for m in chunks}
    for r, s, m in shapes:
        prof.pipeline[f"{r}x{s}x{m}"] = {
            "balance": [1] * s,
            "fwd_s": [[step(n / m) / s] * m for _ in range(s)],
            "bwd_s": [[2 * step(n / m) / s] * m for _ in range(s)],
            "act_bytes": [1e4 * n / m] * (s - 1),
            "opt_s": [1e-4 / s] * s,
            "grad_bytes": [4e4 / s] * s,
        }
        prof.memory[f"pipeline{r}x{s}x{m}"] = {"model": 1 << 20}
    if comm:
        prof.comm = {
            "allreduce": [], "p2p": [], "ring_step": [5e-5, 1e9], "p2p_link": [5e-5, 1e9],
            "store_rtt_s": 5e-5, "corun_factor": 1.3, "sampled_corun_factor": 1.2,
            "wake_s": 1e-3, "pipeline_first_s": {f"1x2x{m}": 1e-2 for m in chunks},
            "pipeline_step_s": {f"1x2x{m}": 2e-2 for m in chunks},
        }  # fmt: skip
    return prof


def advise_here(flags: dict, facts, ds) -> str | list:
    """advise's request, fit and simulation of ``flags`` without profiling: the predictions'
    advice.json rows, or the one message it exits 2 with."""
    try:
        req = parse_request(flags)
        needs = fit_request(req, facts)
    except UsageError as e:
        return str(e)
    comm = any(c.world > 1 for c in req.grid)
    req.profile = "the sweep's profile"
    prof = check_profile(req, made_profile(req, needs, ds), needs, comm)
    preds = [predict(c, prof, req.cluster, req.stragglers, req.epochs) for c in req.grid]
    recommend(preds)
    report.rows(preds)
    content = report.advice(1.0, preds, recommend(preds), {}, prof.to_dict())
    json.dumps(content, allow_nan=False)  # advice.json holds numbers only
    return content["predictions"]


@pytest.mark.parametrize("graph", ["tiny", "karate", "cora"])
def test_every_cluster_shape_and_strategy_is_advised_or_refused_in_one_message(
    graph, graphs, capsys
):
    base = {"dataset": graphs[graph], "model": "sage", "epochs": 1}
    req = parse_request(base)
    ds = _load_dataset(req)
    facts = graph_facts(req.base, ds)  # one per graph: its partitions are made once each
    outcomes = {}
    for hosts in HOSTS:
        for per_host in RANKS_PER_HOST:
            for stragglers in (False, True):
                shape = (hosts, per_host, stragglers)
                flags = {**base, **cluster_flags(hosts, per_host, stragglers)}
                every = advise_here({**flags, "strategies": ",".join(ALL)}, facts, ds)
                outcomes[shape] = every
                if isinstance(every, str):  # no strategy at all: a message naming each
                    assert all(s in every for s in ("sequential", "sampled")), every
                    continue
                world = hosts * per_host
                for p in every:
                    assert p["workers"] in (1, world)
                    assert math.isfinite(p["epoch_s"]) and p["epoch_s"] > 0
                    assert math.isfinite(p["speedup"]) and p["speedup"] > 0
                    assert p["train_time_s"] == pytest.approx(p["epoch_s"])
                    if p["strategy"] in ("allreduce", "gossip", "gossip-bipartite"):
                        assert p["settings"]["partitions"] % world == 0  # as many per rank
                predicted = {p["strategy"] for p in every}
                assert "sequential" in predicted  # one rank always applies
                for name in ALL:  # each alone: predicted as in the whole grid, or refused
                    try:
                        req = parse_request({**flags, "strategies": name})
                        fit_request(req, facts)
                    except UsageError as e:
                        assert name not in predicted, f"{name} on {shape}: {e}"
                        assert name in str(e) and "Traceback" not in str(e)
                        continue
                    got = {json.dumps(c.settings, sort_keys=True) for c in req.grid}
                    want = {json.dumps(p["settings"], sort_keys=True) for p in every}
                    assert name in predicted and got <= want, (name, shape)
    text = capsys.readouterr().out
    assert "Traceback" not in text
    # the graph's size decides what a large cluster can run: the small graphs leave the
    # subgraph strategies out at 64 ranks, Cora keeps them (each rank a subgraph of its own)
    at64 = {p["strategy"] for p in outcomes[(16, 4, True)]}
    if graph == "cora":
        assert {"allreduce", "gossip", "sampled", "sequential"} <= at64
    else:
        assert at64 == {"sequential"}
        assert "each of the 64 ranks needs a subgraph of its own" in text


def test_advises_own_partitions_each_hold_a_training_node_where_the_graph_allows(graphs, capsys):
    """KarateClub's 4 training nodes: sequential's subgraphs are cut to 4 (its default, 8, would
    leave some without one), said in one line; a count the user gives is kept."""
    flags = {"dataset": graphs["karate"], "model": "sage", "strategies": "sequential"}
    req = parse_request(flags)
    ds = _load_dataset(req)
    facts = graph_facts(req.base, ds)
    fit_request(req, facts)
    assert [c.settings for c in req.grid] == [{}, {"partitions": 4}]
    assert facts.parts(4).ok and facts.parts(4).lacking == 0 and facts.parts(8).lacking > 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "--partitions 4 for sequential's subgraphs, not 8" in line
    assert "4 training nodes" in line
    req = parse_request({**flags, "partitions": 8})
    fit_request(req, facts)
    assert [c.settings for c in req.grid] == [{}, {"partitions": 8}]
    assert "changed" not in capsys.readouterr().out
    with pytest.raises(UsageError, match="--partitions 40: the graph has 34 nodes"):
        fit_request(parse_request({**flags, "partitions": 40}), facts)


def test_advises_own_subgraphs_are_dealt_evenly_to_the_ranks(capsys):
    """3 ranks: 6 subgraphs, not the default 8 (a rank left without one in a step of
    --sync-every 20 has no gradients to average: gnnpar train fails there), said in one line;
    sequential keeps 8."""
    req = parse_request({"dataset": "cora", "model": "sage", "workers": 3})
    req.strategies = ("sequential", "allreduce")
    req.grid = [c for c in req.grid if c.strategy in req.strategies]
    fit_request(req, graph_facts(req.base, _load_dataset(req)))
    parts = {(c.strategy, c.settings.get("partitions")) for c in req.grid}
    assert parts == {("sequential", None), ("sequential", 8), ("allreduce", 6)}
    out = capsys.readouterr().out
    assert "--partitions 6 for the ranks' subgraphs, not 8 (a multiple of the 3 ranks" in out


def test_a_subgraph_without_a_training_node_is_profiled_as_the_loop_trains_it(graphs):
    """KarateClub in 8 subgraphs, only 4 of them holding a training node: the ones without have
    no loss (the training loop's rule), and their steps are timed all the same."""
    torch.set_num_threads(1)  # as the profile's ranks (restored by the module's fixture)
    base = {"dataset": graphs["karate"], "model": "sage", "threads": 1}
    req = parse_request(base)
    ds = _load_dataset(req)
    assert graph_facts(req.base, ds).parts(8).lacking >= 4
    prof = Profile("here", 2, 1, "karate", "sage", 1, 0, 34, 4, 1, 1)
    profile_graph_batches(flags_for(req.base, "sequential"), ds, [8], False, prof)
    assert len(prof.parts_step_s["8"]) == 8 and min(prof.parts_step_s["8"]) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategies", "sampled"], "4 training nodes, fewer than the 64 ranks"),
        (["--strategies", "allreduce,gossip"], "each of the 64 ranks needs a subgraph"),
        (["--strategies", "hybrid", "--chunks", "4"], "micro-batches"),
        (["--partitions", "40", "--strategies", "sequential", "--workers", "1"], "--partitions 40"),
    ],
)
def test_nothing_to_predict_is_one_message_and_leaves_no_folder(
    graphs, tmp_path, capsys, args, message
):
    """The issue's small-graph requests: exit 2 naming what and why, before any profile, and the
    output folder (and the folder above it, made for it) never made."""
    out = tmp_path / "runs" / "advise-16"
    cluster = ["--hosts", "16", "--ranks-per-host", "4", "--network", "10gbit,50us"]
    if "--workers" in args:
        cluster = []
    argv = ["advise", "--dataset", graphs["karate"], "--model", "sage", *cluster, *args]
    code = main([*argv, "--out", str(out)])
    err = capsys.readouterr()
    assert code == 2 and message in err.err and "Traceback" not in err.err
    assert "profiling" not in err.out
    assert not (tmp_path / "runs").exists()


def test_the_output_folder_is_checked_but_not_made_before_profiling(tmp_path):
    from gnnpar.advise.command import check_writable, remove_empty_folders

    top = check_writable(tmp_path / "a" / "b")
    assert top == tmp_path / "a" and not top.exists()
    assert check_writable(tmp_path) is None
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is inside .*file, a file"):
        check_writable(tmp_path / "file" / "out")
    (tmp_path / "a" / "b" / "validate" / "00").mkdir(parents=True)
    (tmp_path / "a" / "kept").mkdir()
    (tmp_path / "a" / "kept" / "result.json").write_text("{}")
    remove_empty_folders(tmp_path / "a")  # the empty ones go, what holds a file stays
    assert not (tmp_path / "a" / "b").exists() and (tmp_path / "a" / "kept").exists()


# ----------------------------------------------------------------------- profiled for real
@pytest.fixture(scope="module")
def profiled(graphs, tmp_path_factory):
    """Two ``gnnpar advise`` processes at once, each profiling for real: the README's 16-host
    example on its KarateClub file, and every strategy with stragglers on the tiny graph across
    2 hosts of 4 ranks (its co-run probe on subgraphs this graph allows)."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("profiled")
    cases = {
        "readme": ["--dataset", graphs["readme"], "--model", "sage", "--hosts", "16",
                   "--ranks-per-host", "4", "--network", "10gbit,50us", "--slowdown", "3=3"],
        "tiny": ["--dataset", graphs["tiny"], "--model", "sage", "--hosts", "2",
                 "--ranks-per-host", "4", "--network", "1gbit,1ms", "--slowdown", "3=3",
                 "--epochs", "2", "--strategies", ",".join(ALL), "--profile-rounds", "1"],
    }  # fmt: skip
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        futures = {
            name: pool.submit(run_cli, "advise", *args, "--out", str(tmp / name), timeout=300)
            for name, args in cases.items()
        }
    return {name: (f.result(), tmp / name) for name, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["readme", "tiny"])
def test_profiled_for_real_on_small_graphs(profiled, case):
    done, out = profiled[case]
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    advice = json.loads((out / "advice.json").read_text())
    names = {p["strategy"] for p in advice["predictions"]}
    if case == "readme":  # 34 nodes cannot make a subgraph for each of 64 ranks
        assert names == {"sequential"}
        assert "each of the 64 ranks needs a subgraph" in advice["omitted"]["allreduce"]
        assert any(c.startswith("--partitions 10 for sequential's") for c in advice["changed"])
    else:
        assert {"sequential", "allreduce", "gossip", "sampled"} <= names
        assert advice["profile"]["comm"].get("corun_factor", 0) >= 1


def test_validate_across_emulated_hosts_gives_each_rank_its_share_of_the_cores(monkeypatch):
    """--validate --hosts 2 runs both hosts on this machine: on 2 cores, 1 thread per rank
    (not the 2 a host of its own would give its one rank), said in one line; --threads given,
    or no --validate, keeps the usual count."""
    monkeypatch.setattr("gnnpar.advise.command.os.cpu_count", lambda: 2)
    flags = {"dataset": "cora", "model": "gcn", "hosts": 2, "ranks_per_host": 1}
    flags |= {"network": "100mbit,5ms", "strategies": "allreduce,gossip"}
    req = parse_request({**flags, "validate": True})
    assert req.threads == 1 and req.base["threads"] == 1
    (change,) = req.changes
    assert change.startswith("--threads 1 per rank, not 2 (--validate runs the 2 hosts")
    assert parse_request(flags).threads == 2 and not parse_request(flags).changes
    assert parse_request({**flags, "validate": True, "threads": 2}).threads == 2


def test_the_co_run_probe_takes_subgraphs_the_graph_allows(graphs):
    """A grid of pipelines only still has its two ranks' co-run probe (allreduce on subgraphs):
    on KarateClub 4 of them (8 would leave some without a training node); a grid with
    subgraphs of its own takes those; one rank, or no pipeline nor subgraph, none."""
    from gnnpar.advise.command import _corun_partitions
    from gnnpar.advise.profile import Need

    req = parse_request({"dataset": graphs["karate"], "model": "sage"})
    facts = graph_facts(req.base, _load_dataset(req))
    pipe = Need("pipeline", stages=2, chunks=2)
    assert _corun_partitions([pipe], True, facts) == 4
    assert _corun_partitions([pipe, Need("parts", partitions=2)], True, facts) is None
    assert _corun_partitions([pipe], False, facts) is None
    assert _corun_partitions([Need("sampled", batch_size=512, world=2)], True, facts) is None
