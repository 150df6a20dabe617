"""The final evaluation's modes (``--eval-mode``): sampled evaluation (the scored nodes in
mini-batches through training's sampler and fan-outs) is reproducible from the seed and the
same from a prepared folder as from memory, and with every neighbour it is full-graph
inference; ``auto`` chooses from the memory the run may use (``GNNPAR_MEMORY_LIMIT`` stands for
a cgroup's limit here) and says why."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import coalesce, to_undirected

from gnnpar.config.schema import ModelConfig
from gnnpar.data.prepared import load_graph, made_record, write_graph
from gnnpar.data.sampling.loader import EvalBatches, save_shared_graph
from gnnpar.data.sampling.sampler import CSRGraph
from gnnpar.data.types import GraphDataset
from gnnpar.models import build_model
from gnnpar.training import evaluation as ev

N, F, C = 800, 16, 5


def _dataset() -> GraphDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, F, generator=g)
    ei = to_undirected(coalesce(torch.randint(0, N, (2, 6000), generator=g), num_nodes=N), N)
    y = torch.randint(0, C, (N,), generator=g)
    split = torch.randint(0, 8, (N,), generator=g)  # 3/8 of the nodes in a split
    masks = {f"{s}_mask": split == i for i, s in enumerate(("train", "val", "test"))}
    return GraphDataset("g", Data(x=x, edge_index=ei, y=y, **masks), C)


def _model():
    mc = ModelConfig()
    mc.name, mc.hidden, mc.layers, mc.dropout = "sage", 32, 3, 0.5
    torch.manual_seed(1)
    return build_model(mc, F, C, False).eval()


def _sources(ds, tmp_path):
    """(the file training's shared graph is in memory, a prepared folder) of ``ds``."""
    d = ds.data
    shared = tmp_path / "shared.pt"
    save_shared_graph(str(shared), CSRGraph.from_edge_index(d.edge_index, N), d.x, d.y)
    tensors = {k: d[k] for k in ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")}
    meta = {"name": "g", "num_classes": C, "multilabel": False, "directed": False}
    made = made_record("test", None, 0, "given")
    folder = write_graph(tensors, meta, tmp_path / "prepared", "fp32", made)
    return shared, folder


def test_sampled_evaluation_is_reproducible_and_the_same_from_disk_as_from_memory(tmp_path):
    ds = _dataset()
    shared, folder = _sources(ds, tmp_path)
    disk = load_graph(folder)
    ids = ev.scored_nodes(ds.data)
    assert torch.equal(ids, ev.scored_nodes(disk.data)) and 0 < ids.numel() < N
    model = _model()

    def logits(path, seed=7):
        return ev.sampled_logits(model, EvalBatches(str(path), ids, [4, 3, 2], 64, seed))

    mem = logits(shared)
    assert mem.shape == (ids.numel(), C)
    assert torch.equal(mem, logits(shared))  # the same seed, the same batches
    assert torch.equal(mem, logits(folder))  # from disk: the same, bit for bit
    assert not torch.equal(mem, logits(shared, seed=8))  # another seed, other neighbours
    # what sampled training scores: val and test only (train_score: not computed)
    some = ev.scored_nodes(ds.data, ev.SAMPLED_SPLITS)
    assert torch.equal(some, (ds.data.val_mask | ds.data.test_mask).nonzero().flatten())

    def batches(path):
        return EvalBatches(str(path), some, [4, 3, 2], 64, 7)

    own = ev.sampled_logits(model, batches(shared))
    scores, _ = ev.evaluate_sampled(model, ds, batches(shared))
    assert scores == ev.split_scores(own, some, ds, ev.SAMPLED_SPLITS)
    assert scores == ev.evaluate_sampled(model, disk, batches(folder))[0]
    assert scores["train"] is None and 0 <= scores["val"] <= 1 and 0 <= scores["test"] <= 1


def test_sampled_evaluation_with_every_neighbour_is_full_graph_inference(tmp_path):
    ds = _dataset()
    shared, _ = _sources(ds, tmp_path)
    ids = ev.scored_nodes(ds.data)
    model = _model()
    sampled = ev.sampled_logits(model, EvalBatches(str(shared), ids, [-1, -1, -1], 100, 0))
    whole = ev.graph_logits(model, ds.data.x, ds.data.edge_index)[ids]
    torch.testing.assert_close(sampled, whole, rtol=1e-4, atol=1e-5)  # another sum order


def test_auto_chooses_from_the_memory_the_run_may_use_and_says_why(monkeypatch):
    ds, model = _dataset(), _model()
    hidden, largest, graph = ev.layerwise_bytes(model, ds)
    # layers of 32, 32 and 5 (the classes) wide: two of 32 at once; nothing built in memory
    assert (hidden, largest, graph) == (2 * N * 32 * 4, N * 32 * 4, 0)

    def choose(limit: str, setting: str = "auto", fanouts=(15, 10, 5)):
        monkeypatch.setenv("GNNPAR_MEMORY_LIMIT", limit)
        return ev.choose_eval_mode(setting, model, ds, fanouts and list(fanouts), 256)

    fits = choose("1G")
    assert fits.mode == "layerwise" and fits.record() == {"eval_mode": "layerwise"}
    assert (
        "hidden states (200.0 KiB at once) fit in half of the memory cgroup's limit of 1.0 GiB"
        in (fits.line())
    )
    monkeypatch.setattr(ev, "SMALL_SPILL", 1)  # a spill of 100 KiB counts as large
    tight = choose("300K")
    assert tight.mode == "sampled" and tight.limited  # batches made in-process under a limit
    assert tight.record() == {"eval_mode": "sampled", "eval_fanouts": [15, 10, 5]} | {
        "eval_batch_size": 256
    }
    assert tight.line().startswith("gnnpar: final evaluation sampled (fan-outs 15,10,5, batches")
    assert "would not fit in half of the memory cgroup's limit of 300.0 KiB" in tight.line()
    monkeypatch.setattr(ev, "SMALL_SPILL", 1 << 30)  # a small spill: layer-wise all the same
    assert choose("300K").mode == "layerwise" and "spill little" in choose("300K").why
    # full-graph and Cluster-GCN training have no fan-outs: layer-wise whatever the memory
    assert choose("1K", fanouts=None).mode == "layerwise"
    assert choose("1K", "layerwise").mode == "layerwise"
    assert choose("1T", "sampled").mode == "sampled"
    # a prepared folder's CSR is read in place by SAGE's row blocks: nothing built, even from
    # half-precision features; GCN's sparse product builds the whole adjacency: counted
    ds.info = {"prepared": "/x", "num_edges": 10**8, "num_features": F, "feature_dtype": "fp16"}
    assert ev.layerwise_bytes(model, ds)[2] == 0 and choose("1G").mode == "layerwise"
    mc = ModelConfig()
    mc.name, mc.hidden, mc.layers = "gcn", 32, 3
    model = build_model(mc, F, C, False).eval()
    assert ev.layerwise_bytes(model, ds)[2] == 16 * 10**8 + 4 * N * F
    assert choose("1G").mode == "sampled" and "the graph it builds (1.5 GiB)" in choose("1G").why


@pytest.mark.parametrize("mode", ["auto", "layerwise"])
def test_full_graph_strategies_record_layerwise_evaluation(tmp_path, mode):
    from gnnpar.configure import build_config
    from gnnpar.run import prepare, run_rank

    flags = {"dataset": "karate", "model": "gcn", "epochs": "1", "quiet": True}
    cfg = build_config(None, {**flags, "eval-mode": mode, "out": str(tmp_path / "run")})
    result = run_rank(cfg, prepare(cfg))
    assert result["eval_mode"] == "layerwise" and "eval_fanouts" not in result


def test_sampled_training_records_its_sampled_evaluation(tmp_path, capsys):
    from gnnpar.configure import build_config
    from gnnpar.run import prepare, run_rank

    flags = {"dataset": "karate", "model": "sage", "strategy": "sampled", "epochs": "1"}
    flags |= {"fanouts": "3,2,2", "batch-size": "8", "eval-mode": "sampled"}
    cfg = build_config(None, {**flags, "out": str(tmp_path / "run")})
    result = run_rank(cfg, prepare(cfg))
    assert result["eval_mode"] == "sampled" and result["eval_fanouts"] == [3, 2, 2]
    assert result["eval_batch_size"] == 8 and result["train_score"] is None
    said = [x for x in capsys.readouterr().out.splitlines() if "final evaluation" in x]
    assert said == ["gnnpar: final evaluation sampled (fan-outs 3,2,2, batches of 8): "
                    "--eval-mode sampled"]  # fmt: skip
