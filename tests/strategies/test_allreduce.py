"""AllReduce-GCN (study 003 algorithms 3-4) with real gloo ranks against a one-process reference.

"Joined batch": at each step rank r computes the gradient of its subgraph's mean loss L_r and
the ranks average them, so one step equals one step of a single process on the union of the
subgraphs (a disconnected graph, no edges between them) with loss mean_r L_r: the mean of the
per-subgraph means, not the mean over all their training nodes (the two differ when subgraphs
hold different numbers of training nodes). At the last step of an uneven split only the ranks
that still hold a subgraph contribute, and the mean is over them.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch_geometric.data import Data

from gnnpar.cli import main
from gnnpar.config.schema import Config
from gnnpar.configure import resolve
from gnnpar.data.datasets import GraphDataset
from gnnpar.data.partition import build_partitioned, partition_nodes
from gnnpar.models import build_model
from gnnpar.result import build_result
from gnnpar.run import prepare, train_rank
from gnnpar.runtime.launch import launch
from gnnpar.training.losses import graph_loss
from gnnpar.training.seeding import seed_everything
from gnnpar.training.sources import assign_parts, epoch_order


def random_graph(n: int = 48, seed: int = 0) -> GraphDataset:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (200,), generator=g)
    dst = torch.randint(0, n, (200,), generator=g)
    edge_index = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)
    mask = torch.rand(n, generator=g) < 0.7
    data = Data(
        x=torch.randn(n, 5, generator=g),
        edge_index=edge_index,
        y=torch.randint(0, 3, (n,), generator=g),
        train_mask=mask,
        val_mask=~mask,
        test_mask=~mask,
    )
    return GraphDataset("random48", data, 3)


def config(parts: int, average: str, sync_every: int = 1, epochs: int = 3) -> Config:
    cfg = Config()
    cfg.data.dataset, cfg.data.partitions, cfg.data.data_root = "cora", parts, None
    cfg.model.name, cfg.model.hidden, cfg.model.dropout = "gcn", 8, 0.0
    cfg.strategy.name, cfg.strategy.workers, cfg.strategy.average = "allreduce", 2, average
    cfg.strategy.sync_every, cfg.strategy.timeout_s = sync_every, 60
    cfg.optim.optimizer, cfg.optim.lr = "sgd", 0.5
    cfg.run.epochs, cfg.run.quiet, cfg.run.seed = epochs, True, 3
    resolve(cfg)
    return cfg


SCENARIOS = {"grads5": (5, "grads"), "grads4": (4, "grads"), "params4": (4, "params")}


def _train_ranks(log_dir: str) -> dict:
    """Each rank trains every scenario in one process group; returns weights and counts."""
    from gnnpar.runtime.dist import setup, teardown

    ctx = setup(60)
    out = {}
    for name, (parts, average) in SCENARIOS.items():
        cfg, ds = config(parts, average), random_graph()
        outcome = train_rank(cfg, ds, ctx, prepare(cfg))
        weights = {k: v.tolist() for k, v in outcome.model.state_dict().items()}
        result = build_result(cfg, outcome, ds, ctx.world_size)
        out[name] = {"weights": weights, "batches": outcome.per_worker_batches, **result}
    teardown()
    return out


def reference_weights(parts: int, world: int = 2) -> dict[str, torch.Tensor]:
    """One process, one SGD step per step of the parallel run, on the joined batch."""
    cfg, ds = config(parts, "grads"), random_graph()
    seed_everything(cfg.run.seed)
    model = build_model(cfg.model, ds.num_features, ds.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    part = partition_nodes("random", ds.data.edge_index, ds.num_nodes, parts, cfg.run.seed)
    graph = build_partitioned(ds.data, part, parts)
    owned = assign_parts(parts, world, cfg.run.seed)
    for epoch in range(cfg.run.epochs):
        orders = [epoch_order(owned[r], cfg.run.seed, epoch, r) for r in range(world)]
        for i in range(math.ceil(parts / world)):
            joined = [graph.batch(o[i]) for o in orders if i < len(o)]
            opt.zero_grad()
            loss = sum(graph_loss(model, b, False) for b in joined) / len(joined)
            loss.backward()
            opt.step()
    return model.state_dict()


@pytest.fixture(scope="module")
def two_rank_runs() -> dict:
    return launch(_train_ranks, (), 2, timeout_s=120)


def test_static_split_is_even_disjoint_and_complete():
    owned = assign_parts(7, 3, seed=0)
    assert sorted(p for ps in owned for p in ps) == list(range(7))
    assert sorted(len(ps) for ps in owned) == [2, 2, 3]
    assert owned == assign_parts(7, 3, seed=0)
    assert sorted(epoch_order(owned[0], 0, 1, 0)) == sorted(owned[0])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scenario", ["grads4", "grads5"])
@pytest.mark.slow
def test_two_ranks_allreduce_every_step_equal_one_rank_on_joined_batches(two_rank_runs, scenario):
    parts = SCENARIOS[scenario][0]
    expected = reference_weights(parts)
    for rank in (0, 1):  # both ranks hold the same model
        got = two_rank_runs[rank][scenario]["weights"]
        for key, value in expected.items():
            torch.testing.assert_close(torch.tensor(got[key]), value, rtol=1e-5, atol=1e-6)
    run = two_rank_runs[0][scenario]
    assert sum(run["batches"]) == parts * 3  # every subgraph once per epoch, 3 epochs
    assert run["batches"] == [3 * math.ceil(parts / 2), 3 * (parts // 2)]
    assert run["per_worker_exchanges"] == [3 * math.ceil(parts / 2)] * 2
    assert run["final_model"] == "rank0"


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_parameter_averaging_every_step_equals_gradient_averaging_with_sgd(two_rank_runs):
    grads, params = two_rank_runs[0]["grads4"], two_rank_runs[0]["params4"]
    for key, value in grads["weights"].items():
        torch.testing.assert_close(
            torch.tensor(params["weights"][key]), torch.tensor(value), rtol=1e-5, atol=1e-6
        )
    assert params["average"] == "params" and params["per_worker_exchanges"] == [6, 6]


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_cli_two_workers_with_straggler_and_periodic_averaging(cli, tmp_path):
    proc = cli(
        "train", "--dataset", "cora", "--model", "gcn", "--strategy", "allreduce",
        "--partitions", "6", "--workers", "2", "--epochs", "2", "--sync-every", "2",
        "--average", "params", "--slowdown", "1=2", "--eval-every", "0", "--quiet",
        "--data-root", str(tmp_path), "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "out" / "result.json").read_text())
    assert r["workers"] == 2 and r["per_worker_batches"] == [6, 6]
    assert r["per_worker_exchanges"] == [3, 3]  # 6 steps, averaged every 2
    # the last step averaged the parameters: both candidates are the same model, the average wins
    assert r["final_model"] == "average" and r["slowdown"] == {"1": 2.0}
    cands = r["candidates"]
    assert cands["average"]["val_score"] == cands["best_local"]["val_score"]
    assert r["test_score"] == cands["average"]["test_score"]
    assert r["per_worker_divergence"] == [0.0, 0.0]  # one model on both ranks
    assert r["per_worker_delay_s"][0] == 0 and r["per_worker_delay_s"][1] > 0
    assert len(r["per_worker_wait_s"]) == 2 and r["train_time_s"] > 0
    assert 0 <= r["test_score"] <= 1 and r["partition_time_s"] > 0
    assert (tmp_path / "cache" / "partitions" / "cora-scale1-random-6-seed0.pt").exists()


@pytest.mark.slow
def test_parameter_averaging_with_an_uneven_split_averages_on_every_rank(cli, tmp_path):
    """3 subgraphs on 2 ranks, K = 2: rank 1's second step of each epoch has no subgraph (and,
    before its first one, no gradients). Both ranks average every parameter at steps 2 and 4
    and end with one model (it failed: torch's averager left out parameters without a grad)."""
    proc = cli(
        "train", "--dataset", "cora", "--model", "gcn", "--strategy", "allreduce",
        "--partitions", "3", "--workers", "2", "--epochs", "2", "--sync-every", "2",
        "--average", "params", "--eval-every", "0", "--quiet",
        "--data-root", str(tmp_path), "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "o" / "result.json").read_text())
    assert sorted(r["per_worker_batches"]) == [2, 4] and r["per_worker_exchanges"] == [2, 2]
    assert r["per_worker_divergence"] == [0.0, 0.0] and r["final_model"] == "average"


@pytest.mark.slow
def test_gradient_averaging_every_k_scores_both_final_candidates(cli, tmp_path):
    """K > 1 with grads leaves the ranks' models apart: the better of average / best local wins."""
    proc = cli(
        "train", "--dataset", "cora", "--model", "gcn", "--strategy", "allreduce",
        "--partitions", "6", "--workers", "2", "--epochs", "2", "--sync-every", "4",
        "--eval-every", "0", "--quiet", "--data-root", str(tmp_path), "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "o" / "result.json").read_text())
    cands = r["candidates"]
    avg, best = cands["average"], cands["best_local"]
    assert best["rank"] in (0, 1) and r["per_worker_exchanges"] == [1, 1]  # 6 steps, K = 4
    if avg["val_score"] >= best["val_score"]:
        assert r["final_model"] == "average" and r["test_score"] == avg["test_score"]
    else:
        assert r["final_model"] == f"best-local:rank{best['rank']}"
        assert r["test_score"] == best["test_score"]
    assert r["val_score"] == max(avg["val_score"], best["val_score"])
    # two local steps on different subgraphs after the last all-reduce: the models differ
    assert all(d > 0 for d in r["per_worker_divergence"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--partitions", "2", "--workers", "3"], "fewer than the 3 ranks"),
        (["--partitions", "4", "--sync-every", "0"], "--sync-every must be at least 1"),
        (["--partitions", "4", "--average", "weights"], "Unknown --average"),
        ([], "pass --partitions N"),
        (["--partitions", "4", "--slowdown", "5=2"], "names rank 5"),
    ],
)
def test_bad_input_exits_2_before_launch(capsys, tmp_path, flags, message):
    base = ["train", "--dataset", "cora", "--model", "gcn", "--strategy", "allreduce"]
    code = main([*base, "--workers", "2", "--quiet", "--out", str(tmp_path), *flags])
    err = capsys.readouterr().err  # in-process: these checks run before anything is launched
    assert code == 2 and message in err and "Traceback" not in err


def test_dealt_subgraphs_are_the_same_tensors_every_epoch():
    """DealtPartitions makes each subgraph once: epoch after epoch a subgraph is the same Data
    (views of the partitioned graph), so what the model keeps per input tensor (the sparse
    input's CSR plan, the GCN adjacency) is found again instead of rebuilt every step."""
    from gnnpar.training.sources import DealtPartitions

    cfg, ds = config(6, "grads"), random_graph()
    part = partition_nodes("random", ds.data.edge_index, ds.num_nodes, 6, cfg.run.seed)
    graph = build_partitioned(ds.data, part, 6)
    source = DealtPartitions(graph, 0, 2, 3, cfg.run.seed, None, torch.device("cpu"))
    seen = [{int(b.n_id[0]): b for b in source.epoch(e)} for e in range(3)]
    assert seen[0].keys() == seen[1].keys() == seen[2].keys() and len(seen[0]) == 3
    for first, b in seen[0].items():
        assert seen[1][first] is b and seen[2][first] is b
        x = graph.tensors["x"]  # a view of the graph's features, not a copy
        assert b.x.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
