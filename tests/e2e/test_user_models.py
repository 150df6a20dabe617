"""A user's model trained with every strategy that takes it unchanged (issue 20), real ranks.

Three models -- PyG's ``GIN``, PyG's ``GAT(v2=True)`` and a hand-written one
(tests/models/user_models.py: two linear layers around an APPNP propagation) -- each trained
with sequential, allreduce (2 ranks), gossip (2 ranks) and sampled (2 ranks) on karate: model.pt
reloads as the user's own module and ``gnnpar predict`` reproduces result.json's test_score. One
module-scoped fixture trains each model x strategy once (in this process's launcher, as
``gnnpar.fit`` does). STRATEGIES is the hook for more columns (pipeline: part B's).

And the equivalence the built-in models have (tests/strategies/test_allreduce.py): 2 ranks with
all-reduce every step equal one rank on the joined batch, for a user's model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gnnpar.cli import main
from gnnpar.models import build_model
from gnnpar.predict import predict
from gnnpar.result import read_model_file
from gnnpar.run import prepare, train_rank
from gnnpar.runtime.launch import launch
from gnnpar.training.losses import graph_loss
from gnnpar.training.seeding import seed_everything
from gnnpar.training.sources import assign_parts, epoch_order
from tests.models import user_models
from tests.strategies.test_allreduce import config, random_graph

HAND = "tests.models.user_models:build"
MODELS = {  # id -> flags
    "gin": ["--model", "pyg:GIN", "--hidden", "16"],
    "gatv2": [
        "--model",
        "pyg:GAT",
        "--model-args",
        '{"v2": true}',
        "--heads",
        "2",
        "--hidden",
        "8",
    ],
    "appnp": ["--model", HAND, "--model-args", '{"hidden": 8}'],
}
CLASSES = {
    "gin": "torch_geometric.nn.models.basic_gnn.GIN",
    "gatv2": "torch_geometric.nn.models.basic_gnn.GAT",
    "appnp": "tests.models.user_models.LinearAPPNP",
}
STRATEGIES = {  # id -> flags; add a column here (e.g. pipeline with --stages 2)
    "sequential": ["--strategy", "sequential"],
    "allreduce": ["--strategy", "allreduce", "--workers", "2", "--partitions", "2"],
    "gossip": ["--strategy", "gossip", "--workers", "2", "--partitions", "2"],
    "sampled": ["--strategy", "sampled", "--workers", "2", "--batch-size", "8"],
}
# one model enough for the rest of what the issue names: gossip-bipartite, Cluster-GCN batches
EXTRA = {
    ("appnp", "gossip-bipartite"): [
        *("--strategy", "gossip-bipartite", "--workers", "2", "--partitions", "2"),
        *("--sync-every", "2"),
    ],
    ("gin", "sequential-clustergcn"): ["--strategy", "sequential", "--partitions", "2"],
}
COMMON = ["--dataset", "karate", "--epochs", "2", "--eval-every", "0", "--threads", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Every model x strategy, trained once: (model, strategy) -> the run's folder."""
    base = tmp_path_factory.mktemp("user-models")
    out = {}
    cells = {(m, s): flags for m in MODELS for s, flags in STRATEGIES.items()}
    for (m, s), strategy_flags in {**cells, **EXTRA}.items():
        run = base / f"{m}-{s}"
        argv = ["train", *COMMON, *MODELS[m], *strategy_flags, "--quiet", "--out", str(run)]
        argv += ["--data-root", str(base / "data")]
        assert main(argv) == 0, (m, s)
        out[m, s] = run
    return out


CELLS = [(m, s) for m in MODELS for s in STRATEGIES] + list(EXTRA)


@pytest.mark.timeout(600)
@pytest.mark.slow
@pytest.mark.parametrize("model, strategy", CELLS, ids=[f"{m}-{s}" for m, s in CELLS])
def test_user_model_trains_reloads_and_predict_reproduces_the_test_score(runs, model, strategy):
    run = runs[model, strategy]
    result = json.loads((run / "result.json").read_text())
    assert result["model"] == MODELS[model][1] and strategy.startswith(result["strategy"])
    assert result["user_model"]["class"] == CLASSES[model]
    assert all(math.isfinite(v) for v in _losses(result["loss_curve"]))
    payload = read_model_file(run)
    assert payload["user_model"]["target"] == MODELS[model][1]
    got = predict(str(run), out=str(run / "preds"))
    assert got["scores"]["test"] == pytest.approx(result["test_score"], abs=1e-6)
    assert got["scores"]["val"] == pytest.approx(result["val_score"], abs=1e-6)


def _losses(curve) -> list[float]:
    if isinstance(curve, dict):
        return [v for values in curve.values() for v in values]
    return list(curve)


# --------------------------------------------------- allreduce at K = 1 = one rank, joined
PARTS = 4


def user_config():
    cfg = config(PARTS, "grads")
    cfg.model.name, cfg.model.args = HAND, {"hidden": 8, "K": 3}
    return cfg


def _train_user_ranks(log_dir: str) -> dict:
    from gnnpar.runtime.dist import setup, teardown

    ctx = setup(60)
    cfg, ds = user_config(), random_graph()
    outcome = train_rank(cfg, ds, ctx, prepare(cfg))
    module = outcome.model.user_module
    assert isinstance(module, user_models.LinearAPPNP)
    weights = {k: v.tolist() for k, v in module.state_dict().items()}
    teardown()
    return {"weights": weights, "batches": outcome.per_worker_batches}


def reference_weights(world: int = 2) -> dict[str, torch.Tensor]:
    """One process, one SGD step per step of the parallel run, on the joined batch."""
    from gnnpar.data.partition import build_partitioned, partition_nodes

    cfg, ds = user_config(), random_graph()
    seed_everything(cfg.run.seed)
    model = build_model(cfg.model, ds.num_features, ds.num_classes, graph=ds.data)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    part = partition_nodes("random", ds.data.edge_index, ds.num_nodes, PARTS, cfg.run.seed)
    graph = build_partitioned(ds.data, part, PARTS)
    owned = assign_parts(PARTS, world, cfg.run.seed)
    for epoch in range(cfg.run.epochs):
        orders = [epoch_order(owned[r], cfg.run.seed, epoch, r) for r in range(world)]
        for i in range(math.ceil(PARTS / world)):
            joined = [graph.batch(o[i]) for o in orders if i < len(o)]
            opt.zero_grad()
            loss = sum(graph_loss(model, b, False) for b in joined) / len(joined)
            loss.backward()
            opt.step()
    return model.user_module.state_dict()


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_two_ranks_allreduce_of_a_user_model_equal_one_rank_on_joined_batches():
    runs = launch(_train_user_ranks, (), 2, timeout_s=120)
    expected = reference_weights()
    assert set(expected) == {"lin1.weight", "lin1.bias", "lin2.weight", "lin2.bias"}
    for rank in (0, 1):
        got = runs[rank]["weights"]
        for key, value in expected.items():
            torch.testing.assert_close(torch.tensor(got[key]), value, rtol=1e-5, atol=1e-6)
    assert sum(runs[0]["batches"]) == PARTS * 3


# ------------------------------------------------- gnnpar.fit: an instance copied to 2 ranks
@pytest.mark.timeout(240)
@pytest.mark.slow
def test_fit_copies_an_instance_to_two_ranks_and_trains_it(tmp_path):
    from torch_geometric.datasets import KarateClub
    from torch_geometric.nn.models import GAT

    import gnnpar

    data = KarateClub()[0]
    torch.manual_seed(1)
    model = GAT(34, 8, 2, 4, v2=True, heads=2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    run = gnnpar.fit(
        data, model=model, strategy="allreduce", workers=2, partitions=2, epochs=2,
        lr=1e-6, quiet=True, threads=1, data_root=str(tmp_path / "d"), out=str(tmp_path / "r"),
    )  # fmt: skip
    # Adam moves each weight by about lr per step: the ranks started from the instance's
    # weights (copied, not drawn afresh, which would differ by ~0.1), and trained them
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, start[k], rtol=0, atol=1e-4)
    assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())
    assert run.model is model and run.result["workers"] == 2
    assert run.result["user_model"]["kwargs"]["v2"] is True
    got = predict(str(run.out))
    assert got["scores"]["test"] == pytest.approx(run.result["test_score"], abs=1e-6)
