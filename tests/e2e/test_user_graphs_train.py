"""A user's own graph, in each of its three forms, trains with every graph strategy (real gloo
ranks), writes a model.pt that reloads, and `gnnpar predict` reproduces result.json's test score
exactly (issue 10, "Done means").

Which form a graph came in ends where it is loaded (gnnpar.data.user, in every rank alike),
which is also why the strategies do not see it: each form trains in one process (sequential)
and under the launcher's ranks (each rank loads it: the module form's PYTHONPATH must reach
them), and each strategy with one of the forms, instead of every pair of the two (15 runs, two
minutes of the suite's twenty)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from gnnpar.predict import predict
from gnnpar.result import load_model
from helpers import ROOT, run_cli

STRATEGIES = {
    "sequential": [],
    "allreduce": ["--workers", "2", "--partitions", "4"],
    "gossip": ["--workers", "2", "--partitions", "4"],
    "pipeline": ["--workers", "2", "--stages", "2", "--chunks", "2"],
    "sampled": ["--workers", "2", "--fanouts", "5,5", "--batch-size", "16"],
}


def make_graph(n: int = 90, classes: int = 3, seed: int = 0, masks: bool = True) -> Data:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = torch.randn(n, 8, generator=g) + 0.8 * torch.nn.functional.one_hot(y, 8)
    src = torch.randint(0, n, (300,), generator=g)
    dst = torch.where(
        torch.rand(300, generator=g) < 0.7,
        (src + classes) % n,
        torch.randint(0, n, (300,), generator=g),
    )
    edge_index = to_undirected(torch.stack([src, dst])[:, src != dst], num_nodes=n)
    data = Data(x=x, edge_index=edge_index, y=y)
    if masks:
        idx = torch.arange(n)
        data.train_mask, data.val_mask, data.test_mask = idx % 5 < 3, idx % 5 == 3, idx % 5 == 4
    return data


def write_ogb(folder, data: Data) -> None:
    (folder / "raw").mkdir(parents=True)
    (folder / "split" / "mine").mkdir(parents=True)

    def csv(path, rows) -> None:
        with gzip.open(path, "wt") as f:
            f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)

    csv(folder / "raw/edge.csv.gz", data.edge_index.t().tolist())
    csv(folder / "raw/node-feat.csv.gz", data.x.tolist())
    csv(folder / "raw/node-label.csv.gz", [[int(v)] for v in data.y])
    for split, name in (("train", "train"), ("val", "valid"), ("test", "test")):
        ids = data[f"{split}_mask"].nonzero().view(-1).tolist()
        csv(folder / f"split/mine/{name}.csv.gz", [[i] for i in ids])


@pytest.fixture(scope="module")
def forms(tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """The three forms a user graph comes in: (--dataset value, extra environment)."""
    root = tmp_path_factory.mktemp("user-graphs")
    torch.save(make_graph(masks=False), root / "graph.pt")  # no masks: stratified split
    write_ogb(root / "ogb-like", make_graph(seed=1))
    (root / "mygraphs.py").write_text(
        "from e2e.test_user_graphs_train import make_graph\n\ndef build():\n    return make_graph(seed=2)\n"
    )
    path = f"{root}:{ROOT / 'tests'}"  # the module, and make_graph (tests/e2e/) that it imports
    return {
        "pt": (str(root / "graph.pt"), {}),
        "ogb": (str(root / "ogb-like"), {}),
        "module": ("mygraphs:build", {"PYTHONPATH": path}),
    }


# (strategy, form): every form alone and with ranks, every strategy once
CASES = [("sequential", "pt"), ("sequential", "ogb"), ("sequential", "module")]
CASES += [("allreduce", "module"), ("gossip", "ogb"), ("pipeline", "pt"), ("sampled", "module")]
CASES += [("sampled", "ogb")]


def _train(forms, strategy: str, form: str, out):
    dataset, env = forms[form]
    args = ["train", "--dataset", dataset, "--model", "gcn", "--strategy", strategy]
    args += [*STRATEGIES[strategy], "--epochs", "3", "--quiet", "--out", str(out)]
    return run_cli(*args, env=env, timeout=200)


@pytest.fixture(scope="module")
def trained(forms, tmp_path_factory):
    """Every case's run, two at a time (mostly processes starting): (process, --out)."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("trained")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {c: pool.submit(_train, forms, *c, tmp / "-".join(c)) for c in CASES}
    return {c: (f.result(), tmp / "-".join(c)) for c, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("strategy, form", CASES)
def test_user_graph_trains_saves_and_predicts(forms, trained, form, strategy):
    env = forms[form][1]
    proc, out = trained[strategy, form]
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["workers"] == (1 if strategy == "sequential" else 2)
    model = load_model(out)
    data = make_graph()
    assert model(data.x, data.edge_index).shape == (90, 3)
    if form == "module":
        import sys

        sys.path.insert(0, env["PYTHONPATH"].split(":")[0])
    try:
        got = predict(str(out))
    finally:
        if form == "module":
            sys.path.pop(0)
    assert got["scores"]["test"] == result["test_score"]
