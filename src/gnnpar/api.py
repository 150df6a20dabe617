"""The Python API, for notebooks and scripts::

    import gnnpar
    from torch_geometric.datasets import KarateClub

    run = gnnpar.fit(KarateClub()[0], model="gcn", epochs=50)           # a PyG Data, 1 process
    run = gnnpar.fit("cora", model="gat", strategy="allreduce", workers=2, partitions=8)
    logits = run.model(data.x, data.edge_index)                        # every node's logits
    run.result["test_score"], run.out                                 # result.json, its folder
    model = gnnpar.load("runs/20261122-151500-cora-gat-allreduce")      # later, from the folder

``fit`` takes the same settings as ``gnnpar train`` (``partitions=8`` or ``sync_every=20``) and
runs exactly what the command runs, multi-rank strategies included (the launcher starts the
ranks; the model comes back through the run's ``model.pt``). The model is returned in eval mode
on the CPU, whole (pipeline stages joined back; gossip/allreduce: the chosen final model).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gnnpar.config.parse import default_data_root
from gnnpar.config.validate import build_config
from gnnpar.result import atomic_save, load_model


@dataclass
class FitResult:
    model: nn.Module  # the final model, eval mode, CPU: model(x, edge_index) -> logits
    result: dict[str, Any]  # result.json
    out: Path  # the run's folder (result.json, model.pt, metrics.jsonl)


def fit(
    data: Any,
    model: str = "gcn",
    strategy: str = "sequential",
    workers: int = 1,
    config: str | None = None,
    **flags: Any,
) -> FitResult:
    """Train on ``data`` (a PyG ``Data``, a dataset name, a ``.pt`` path, an OGB folder or
    ``"module:function"``) and return the trained model with its results."""
    from gnnpar.run import run

    if not isinstance(data, (str, Path)):
        data = _save_input(data, flags.get("data_root") or flags.get("data-root"))
    settings = {"dataset": str(data), "model": model, "strategy": strategy, "workers": workers}
    cfg = build_config(config, {**settings, **flags})
    threads = torch.get_num_threads()
    try:
        result = run(cfg)
    finally:
        torch.set_num_threads(threads)
    out = Path(cfg.run.out)
    return FitResult(load_model(out), result or {}, out)


def load(run_dir: str | Path) -> nn.Module:
    """The final model of a finished run (its folder, or its model.pt)."""
    return load_model(run_dir)


def _save_input(data: Any, data_root: str | None) -> Path:
    """An in-memory graph as a file the ranks can read: ``<data-root>/inputs/<sha>.pt`` (its
    content names it, so the same graph is written once and cached once). What is saved is its
    tensors (:func:`gnnpar.data.user.plain_graph`): the ranks read .pt files with
    weights_only=True, which would refuse a class of the user's own."""
    from gnnpar.data.user import plain_graph

    data = plain_graph(data, "gnnpar.fit(data)")
    buf = io.BytesIO()
    torch.save(data, buf)
    digest = hashlib.sha256(buf.getbuffer()).hexdigest()[:20]
    folder = Path(data_root or default_data_root()) / "inputs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"graph-{digest}.pt"
    if not path.exists():
        atomic_save(data, path)
    return path
