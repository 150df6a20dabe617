"""Evaluation in bounded memory: layer-wise inference whose hidden states go to a disk-backed
array (numpy memmap) when they do not fit in the memory the run may use, scoring only the
nodes a split needs at the last layer. The same logits, bit for bit, as the whole-graph paths
(held against the reference implementations of tests/training/test_evaluation.py's paths,
run here with the spill forced by a budget of 1 byte)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import coalesce

from gnnpar.config.schema import ModelConfig
from gnnpar.models import build_model
from gnnpar.training import evaluation as ev


def _graph(n: int = 1500, e: int = 15000, f: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=g)
    ei = coalesce(torch.randint(0, n, (2, e), generator=g), num_nodes=n)  # no repeated edge
    return x, ei[:, torch.randperm(ei.size(1), generator=g)]


def _model(name: str, f: int, hidden: int = 32):
    mc = ModelConfig()
    mc.name, mc.hidden, mc.layers, mc.dropout = name, hidden, 3, 0.5
    if name == "gat":
        mc.heads = 2
    torch.manual_seed(1)
    return build_model(mc, f, 5, False).eval()


def _reference(model, x, ei):
    """The model on the whole graph in one pass, as the small-graph path runs it; and, for
    SAGE, one pass on the sparse adjacency (the fused path of graph_logits before row blocks)."""
    with torch.no_grad():
        return model(x, ei)


@pytest.mark.parametrize("name", ["sage", "gat", "gcn"])
def test_spilled_layerwise_logits_equal_in_memory_ones_bit_for_bit(name, tmp_path, monkeypatch):
    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path / "spill"))
    x, ei = _graph(n=600, e=5000) if name == "gat" else _graph()  # (GAT: 30x slower here)
    model = _model(name, x.size(1))
    limit = 2000 * 32 * 4  # messages: the large-graph paths, in chunks of ~2000 edges
    in_memory = ev.graph_logits(model, x, ei, limit=limit, budget=2**40)
    spilled = ev.graph_logits(model, x, ei, limit=limit, budget=1)
    assert torch.equal(in_memory, spilled)
    targets = torch.sort(torch.randperm(x.size(0))[:200]).values
    some = ev.graph_logits(model, x, ei, limit=limit, budget=1, targets=targets)
    assert some.shape == (200, 5) and torch.equal(some, in_memory[targets])
    # against one pass of the whole model: equal up to rounding (a different sum order)
    torch.testing.assert_close(in_memory, _reference(model, x, ei), rtol=1e-4, atol=1e-5)
    spill = tmp_path / "spill"  # the spilled layers are gone (GCN runs in one pass: none)
    assert (list(spill.iterdir()) == []) if name != "gcn" else not spill.exists()


def test_the_spill_writes_layers_to_disk_and_removes_them(tmp_path, monkeypatch):
    """A 1-byte budget spills each hidden layer into a memmap under GNNPAR_SPILL_DIR, the
    layer before it removed as soon as the next is done, the folder when the pass ends."""
    seen = []
    real = ev.HiddenStore.layer

    def layer(self, rows, width, dtype, in_memory=False):
        t = real(self, rows, width, dtype, in_memory)
        seen.append(
            (self.pending, sorted(p.name for p in self.folder.iterdir()) if self.folder else [])
        )
        return t

    monkeypatch.setattr(ev.HiddenStore, "layer", layer)
    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path))
    x, ei = _graph()
    model = _model("sage", x.size(1))
    ev.graph_logits(model, x, ei, limit=1000, budget=1, targets=torch.arange(10))
    assert [s[1] for s in seen] == [["layer1.npy"], ["layer1.npy", "layer2.npy"], ["layer2.npy"]]
    assert seen[-1][0] is None  # the last layer (10 targets x 5 classes) in memory
    assert list(tmp_path.iterdir()) == []
    seen.clear()
    ev.graph_logits(model, x, ei, limit=1000, budget=2**40)  # it fits: nothing on disk
    assert all(s[0] is None for s in seen)


def test_evaluate_graph_scores_only_the_split_nodes_with_the_same_scores(tmp_path, monkeypatch):
    """evaluate_graph on a graph with 10% of its nodes labelled: the same scores whether its
    hidden states fit or spill, and the same as scoring every node's logits."""
    from types import SimpleNamespace

    from torch_geometric.data import Data

    from gnnpar.training.metrics import score

    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path))
    monkeypatch.setattr(ev, "MESSAGE_BYTES_LIMIT", 1000)
    x, ei = _graph()
    n = x.size(0)
    y = torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(3))
    masks = torch.zeros(3, n, dtype=torch.bool)
    masks[torch.randint(0, 3, (n // 10,)), torch.randperm(n)[: n // 10]] = True
    data = Data(x=x, edge_index=ei, y=y, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])
    ds = SimpleNamespace(data=data, multilabel=False)
    model = _model("sage", x.size(1))
    seen = []
    real = ev.graph_logits

    def spy(*a, **k):
        seen.append(k.get("targets"))
        return real(*a, **k, limit=1000)

    monkeypatch.setattr(ev, "graph_logits", spy)
    monkeypatch.setattr(ev.HiddenStore, "__init__", _force(ev.HiddenStore.__init__, False))
    spilled, _ = ev.evaluate_graph(model, ds)
    assert seen[-1].numel() == int(masks.any(0).sum())  # only the labelled nodes at the end
    monkeypatch.setattr(
        ev.HiddenStore, "__init__", _force(ev.HiddenStore.__init__.__wrapped__, True)
    )
    kept, _ = ev.evaluate_graph(model, ds)
    model.eval()
    logits = real(model, x, ei, limit=1000, budget=2**40)
    whole = {s: score(logits[m], y[m], False) for s, m in zip(("train", "val", "test"), masks)}
    assert spilled == kept == whole


def _force(init, in_memory: bool):
    def wrapped(self, budget, spill_dir, in_memory_=None):
        init(self, budget, spill_dir, in_memory)

    wrapped.__wrapped__ = init
    return wrapped


def test_a_killed_evaluations_spill_is_removed_by_the_next(tmp_path, monkeypatch):
    """A spill folder whose process is gone (killed mid-evaluation) is removed by the next
    evaluation that spills there; a live process's is left alone."""
    import os

    dead = tmp_path / "gnnpar-eval-999999999-abc"  # no such pid
    live = tmp_path / f"gnnpar-eval-{os.getpid()}-abc"
    for f in (dead, live):
        f.mkdir()
        (f / "layer1.npy").write_bytes(b"x")
    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path))
    x, ei = _graph(n=300, e=2000)
    ev.graph_logits(_model("sage", x.size(1)), x, ei, limit=1000, budget=1)
    assert not dead.exists() and live.exists()


@pytest.mark.parametrize("name", ["sage", "gat"])
@pytest.mark.parametrize("budget", [1, 2**40], ids=["spilled", "in-memory"])
def test_closure_layerwise_equals_whole_layerwise_bit_for_bit(name, budget, tmp_path, monkeypatch):
    """Layer-wise inference for a few targets computes each layer only for the closure the next
    reads (S_{l-1} = S_l plus their in-neighbours: counted here by hand from the edges), and
    gives the targets the logits of today's in-memory pass over every node, bit for bit,
    whether the closures' layers spill or not (GAT: the chunked path; SAGE: row blocks)."""
    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path))
    x, ei = _graph(n=1500, e=2500)  # sparse: the closures stay well below the graph
    model = _model(name, x.size(1))
    targets = torch.tensor([1400, 3, 777, 42, 1001])  # in no order: rows come back in theirs
    rows = []
    real = ev.HiddenStore.layer

    def layer(self, n_rows, width, dtype, in_memory=False):
        rows.append(n_rows)
        return real(self, n_rows, width, dtype, in_memory)

    monkeypatch.setattr(ev.HiddenStore, "layer", layer)
    limit = 2000 * 32 * 4
    some = ev.graph_logits(model, x, ei, limit=limit, budget=budget, targets=targets)
    closure_rows = rows[:]
    rows.clear()
    whole = ev.graph_logits(model, x, ei, limit=limit, budget=2**40)
    assert torch.equal(some, whole[targets])
    s2 = torch.zeros(x.size(0), dtype=torch.bool)
    s2[targets] = True
    s2[ei[0][s2[ei[1]]]] = True
    s1 = s2.clone()
    s1[ei[0][s2[ei[1]]]] = True
    assert closure_rows == [int(s1.sum()), int(s2.sum()), 5] and s1.sum() < x.size(0) // 2
    assert rows == [x.size(0)] * 3


def test_a_closure_that_reaches_every_node_computes_every_node(tmp_path, monkeypatch):
    """On a dense graph the first layer's closure is the whole graph: it is computed as without
    targets, and the targets' logits are the same."""
    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path))
    x, ei = _graph(n=300, e=6000)
    model = _model("sage", x.size(1))
    targets = torch.arange(0, 300, 7)
    some = ev.graph_logits(model, x, ei, limit=1000, budget=1, targets=targets)
    assert torch.equal(some, ev.graph_logits(model, x, ei, limit=1000, budget=2**40)[targets])
