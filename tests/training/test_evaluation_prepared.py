"""Evaluation of a prepared graph reads its mapped CSR a block of rows at a time
(:class:`gnnpar.training.evaluation.InEdges`), never the [2, E] int64 edge_index (16 bytes an
edge) nor, for GraphSAGE, the float32 copy of half-precision features: the same logits, bit for
bit, as the in-memory graph's edge_index gives, whatever the folder's edge order (target,
source, permuted), with or without repeated edges, in memory or spilled."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import coalesce, to_undirected

from gnnpar.config.schema import ModelConfig
from gnnpar.data.prepared import load_graph, made_record, open_prepared, write_graph
from gnnpar.models import build_model
from gnnpar.training import evaluation as ev

N, F, C = 600, 12, 4


def _edges(kind: str, g: torch.Generator) -> torch.Tensor:
    ei = torch.randint(0, N, (2, 3000), generator=g)
    if kind == "target":  # sorted by target: the CSR's own order
        ei = ei[:, torch.sort(ei[1], stable=True).indices]
    elif kind == "source":  # symmetric, sorted by (source, target)
        ei = to_undirected(coalesce(ei, num_nodes=N), num_nodes=N)
    elif kind == "repeats":  # repeated edges and self-loops, in no order
        ei = torch.cat([ei, ei[:, :300], torch.arange(50).repeat(2, 1)], 1)
        ei = ei[:, torch.randperm(ei.size(1), generator=g)]
    return ei  # "permuted": random order


def _folder(tmp_path, kind: str, feature_dtype: str = "fp32"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, F, generator=g)
    ei = _edges(kind, g)
    y = torch.randint(0, C, (N,), generator=g)
    split = torch.randint(0, 10, (N,), generator=g)  # 30% of the nodes labelled
    masks = {f"{s}_mask": split == i for i, s in enumerate(("train", "val", "test"))}
    tensors = {"x": x, "edge_index": ei, "y": y, **masks}
    meta = {"name": "g", "num_classes": C, "multilabel": False, "directed": kind != "source"}
    made = made_record("test", None, 0, "given")
    folder = write_graph(tensors, meta, tmp_path / f"{kind}-{feature_dtype}", feature_dtype, made)
    return folder, ei


def _model(name: str):
    mc = ModelConfig()
    mc.name, mc.hidden, mc.layers, mc.dropout = name, 16, 3, 0.5
    if name == "gat":
        mc.heads = 2
    torch.manual_seed(1)
    return build_model(mc, F, C, False).eval()


KINDS = ["target", "source", "permuted", "repeats"]
CASES = [("sage", k) for k in KINDS] + [("gcn", k) for k in KINDS]
CASES += [("gat", "source"), ("gat", "repeats")]  # the chunked path (GAT: slow, two orders)


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_logits_from_the_mapped_csr_equal_those_from_the_edge_index(
    name, kind, tmp_path, monkeypatch
):
    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path / "spill"))
    folder, _ = _folder(tmp_path, kind)
    p = open_prepared(folder)
    assert p.manifest["edge_index_order"] == ("permuted" if kind == "repeats" else kind)
    x, ei = p.tensor("features"), p.edge_index()  # the in-memory graph's, column for column
    edges = ev.InEdges.from_prepared(p)
    model = _model(name)
    limit = 1500 * 16 * 4  # the large-graph paths, in chunks of ~1500 edges
    targets = torch.sort(torch.randperm(N, generator=torch.Generator().manual_seed(2))[:60]).values
    for budget, t in ((2**40, None), (1, targets)):  # every node in memory; a closure spilled
        want = ev.graph_logits(model, x, ei, limit=limit, budget=budget, targets=t)
        got = ev.graph_logits(model, x, edges, limit=limit, budget=budget, targets=t)
        assert torch.equal(got, want), budget
    # a small graph: one pass of the whole model on the rebuilt edge_index
    assert torch.equal(ev.graph_logits(model, x, edges), ev.graph_logits(model, x, ei))


@pytest.mark.parametrize("kind", ["source", "repeats"])  # SAGE's row blocks; its chunks
@pytest.mark.parametrize("feature_dtype", ["fp32", "fp16"])
def test_evaluating_a_prepared_graph_builds_no_edge_index_and_scores_the_same(
    feature_dtype, kind, tmp_path, monkeypatch
):
    """evaluate_graph on a prepared folder's graph leaves its edge_index and its widened fp16
    features unbuilt, and scores as the same graph in memory does."""
    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path / "spill"))
    monkeypatch.setattr(ev, "MESSAGE_BYTES_LIMIT", 1500 * 16 * 4)  # the large-graph paths
    folder, _ = _folder(tmp_path, kind, feature_dtype)
    model = _model("sage")
    from_disk = load_graph(folder)
    scores, _ = ev.evaluate_graph(model, from_disk)
    assert "edge_index" not in from_disk.data._store
    if feature_dtype == "fp16":
        assert "x" not in from_disk.data._store
    in_memory = load_graph(folder)
    in_memory.data._built()  # the edge_index and float32 features, in memory
    assert "edge_index" in in_memory.data._store and in_memory.data.x.dtype == torch.float32
    assert scores == ev.evaluate_graph(model, in_memory)[0]


def test_the_hidden_states_are_sized_layer_by_layer(tmp_path, monkeypatch):
    """Each layer is held in memory or spilled by its own size (rows x its block's width)
    beside the layer it reads: a budget that holds the narrow layers but not a wide one beside
    another spills only the wide one, and the logits stay the same."""
    monkeypatch.setenv("GNNPAR_SPILL_DIR", str(tmp_path / "spill"))
    _, ei = _folder(tmp_path, "source")  # no repeated edge: the row blocks
    x = torch.randn(N, 64, generator=torch.Generator().manual_seed(5))
    mc = ModelConfig()
    mc.name, mc.hidden, mc.layers, mc.dropout = "sage", 16, 4, 0.0
    torch.manual_seed(1)
    model = build_model(mc, 64, C, False).eval()
    # widths 16, 16, 16, 4 (the widest weight: 64, the input's): a layer of N x 16 floats
    layer = N * 16 * 4
    assert ev.block_widths(model) == [16, 16, 16, C]
    kinds = []
    real = ev.HiddenStore.layer

    def spy(self, rows, width, dtype, in_memory=False):
        t = real(self, rows, width, dtype, in_memory)
        kinds.append(self.pending is not None)  # a memmap on disk
        return t

    monkeypatch.setattr(ev.HiddenStore, "layer", spy)
    want = ev.graph_logits(model, x, ei, limit=1000, budget=2**40)
    assert kinds == [False] * 4
    kinds.clear()
    # half the budget holds one layer, not two: the first in memory (it reads the features),
    # the second spilled beside it, the third in memory beside a spilled one
    got = ev.graph_logits(model, x, ei, limit=1000, budget=2 * layer + 1000)
    assert kinds == [False, True, False, False]
    assert torch.equal(got, want)
    kinds.clear()
    # a budget that holds two layers of 16 keeps them all (sized at the widest weight, two
    # layers of 64 would not have fitted: every layer spilled)
    assert torch.equal(ev.graph_logits(model, x, ei, limit=1000, budget=4 * layer + 1000), want)
    assert kinds == [False] * 4
