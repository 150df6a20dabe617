"""``gnnpar predict RUN_DIR``: a trained model's per-node (or per-image) predictions and scores.

    gnnpar predict runs/20261122-151500-cora-gcn-sequential            # the run's own dataset
    gnnpar predict runs/my-run --dataset other.pt --out preds/other    # another graph, same width

Loads ``RUN_DIR/model.pt`` (:mod:`gnnpar.result`), runs exact full-graph inference with the
same bounded-memory code as evaluation (:func:`gnnpar.training.evaluation.graph_logits`), and writes
``<out>.pt`` (``{"node": ids, "pred": class, "prob": probabilities}``) and ``<out>.csv`` (one
row per node: ``node,pred,p_0,...,p_{C-1}``; multi-label: one 0/1 column and one probability per
label). Default ``<out>``: ``RUN_DIR/predictions``. It prints the scores on every split mask the
dataset has: on the run's own dataset the test score equals result.json's ``test_score``
(pipeline runs with ``--microbatch index`` excepted: their result.json scores the edge-losing
micro-batches, this the whole graph). Inference runs in the run's ``--precision`` (model.pt's
config), as its evaluation did; the written probabilities are fp32.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import torch

from gnnpar.config.parse import default_data_root
from gnnpar.config.schema import Config
from gnnpar.data.datasets import load_dataset
from gnnpar.data.types import ImageDataset
from gnnpar.errors import UsageError
from gnnpar.result import atomic_save, build_from, read_model_file
from gnnpar.training.evaluation import graph_logits
from gnnpar.training.metrics import score
from gnnpar.training.precision import autocast


def predict(
    run: str, dataset: str | None = None, out: str | None = None, data_root: str | None = None
) -> dict[str, Any]:
    """Write the predictions; return ``{"scores": {split: score}, "files": [...], ...}``."""
    payload = read_model_file(run)
    cfg = Config.from_dict(payload["config"])
    model = build_from(payload)
    own = dataset is None or dataset == cfg.data.dataset
    name = cfg.data.dataset if dataset is None else dataset
    root = data_root or cfg.data.data_root or str(default_data_root())
    ds = load_dataset(name, root, cfg.data.scale if own else 1.0, cfg.run.seed)
    if ds.num_features != payload["in_dim"]:
        raise UsageError(
            f"Dataset '{name}' has {ds.num_features} input features, but the model in "
            f"{payload['path']} was trained on {payload['in_dim']}: it cannot read this graph."
        )
    t0 = time.perf_counter()
    with autocast(cfg.run.precision, "cpu"):  # the run's precision: its scores, reproduced
        if ds.kind == "image":
            ids, logits, scores = _images(model, ds, cfg.strategy.batch_size or 32)
        else:
            ids, logits, scores = _graph(model, ds)
    logits = logits.float()
    multilabel = bool(payload["multilabel"])
    prob = torch.sigmoid(logits) if multilabel else torch.softmax(logits, -1)
    pred = (logits > 0).to(torch.uint8) if multilabel else logits.argmax(-1)
    base = Path(out) if out else Path(payload["path"]).parent / "predictions"
    if base.suffix in (".pt", ".csv"):
        base = base.with_suffix("")
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        atomic_save({"node": ids, "pred": pred, "prob": prob}, base.with_suffix(".pt"))
        _write_csv(base.with_suffix(".csv"), ids, pred, prob, multilabel)
    except OSError as e:
        raise UsageError(f"Cannot write predictions to {base} ({e.strerror or e}).") from None
    return {
        "dataset": name,
        "scores": scores,
        "files": [str(base.with_suffix(".pt")), str(base.with_suffix(".csv"))],
        "seconds": time.perf_counter() - t0,
        "nodes": int(ids.numel()),
    }


def _graph(model, ds) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    data = ds.data
    with torch.no_grad():
        logits = graph_logits(model, data.x, data.edge_index)
    scores = {}
    for split in ("train", "val", "test"):
        mask = data.get(f"{split}_mask")
        if mask is not None and bool(mask.any()):
            scores[split] = score(logits[mask], data.y[mask], ds.multilabel)
    return torch.arange(ds.num_nodes), logits, scores


def _images(model, ds: ImageDataset, batch: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The test images (in order); scores on val and test."""
    scores, outs = {}, {}
    with torch.no_grad():
        for split in ("val", "test"):
            x, y = getattr(ds, f"{split}_x"), getattr(ds, f"{split}_y")
            outs[split] = torch.cat([model(x[i : i + batch]) for i in range(0, x.size(0), batch)])
            scores[split] = score(outs[split], y, False)
    return torch.arange(ds.test_x.size(0)), outs["test"], scores


def _write_csv(path: Path, ids, pred, prob, multilabel: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    classes = prob.size(1)
    head = ["node"]
    head += [f"pred_{c}" for c in range(classes)] if multilabel else ["pred"]
    head += [f"p_{c}" for c in range(classes)]
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        preds = pred.tolist()
        for i, p, row in zip(ids.tolist(), preds, prob.tolist()):
            w.writerow([i, *(p if multilabel else [p]), *(f"{v:.6g}" for v in row)])
    tmp.replace(path)
