"""``<out>/model.pt``: the final model of a run, with everything needed to rebuild it.

The file is one ``torch.save``d dict of plain values and tensors (so :func:`load_model` reads it
with ``weights_only=True``: loading a model file runs no pickled code)::

    format        "gnnpar-model-1"
    state_dict    the final model's weights (gossip/allreduce: the chosen final model;
                  pipeline/hybrid: every stage joined back into one model)
    model         the resolved model settings (name, hidden, layers, heads, dropout)
    in_dim, num_classes, multilabel
    config        every resolved setting of the run (``run.precision``: the arithmetic its
                  scores were computed in; ``gnnpar predict`` uses it, weights are fp32 always)
    dataset       name and, for user graphs, their content fingerprint
    final_model, scores, versions

Rebuilt, the model is called the PyG way: ``model(x, edge_index)`` gives logits for every node
(ViG: ``model(images)``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gnnpar import UsageError
from gnnpar.config import ModelConfig

FORMAT = "gnnpar-model-1"


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary name, fsync, rename: a reader sees the old file or the new."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_model(path: Path, model: nn.Module, cfg, ds, result: dict[str, Any]) -> Path:
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    # plain JSON-able values only, so that the file loads with weights_only=True
    meta = json.loads(
        json.dumps(
            {
                "model": dataclasses.asdict(cfg.model),
                "in_dim": int(ds.num_features),
                "num_classes": int(ds.num_classes),
                "multilabel": bool(ds.multilabel),
                "config": cfg.to_dict(),
                "dataset": {"name": ds.name, **getattr(ds, "info", {})},
                "final_model": result.get("final_model"),
                "scores": {k: result.get(f"{k}_score") for k in ("val", "test")},
                "versions": result.get("versions"),
            },
            default=str,
        )
    )
    atomic_save({"format": FORMAT, "state_dict": state, **meta}, path)
    return path


def read_model_file(run: str | os.PathLike) -> dict[str, Any]:
    """The dict in ``RUN/model.pt`` (or a model.pt path), checked; UsageError if unusable."""
    path = Path(run)
    if path.is_dir():
        path = path / "model.pt"
    if not path.is_file():
        raise UsageError(
            f"No model file at {path}: give the folder of a finished run (it holds model.pt)."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # zip/pickle/EOF errors of a damaged file
        raise UsageError(
            f"{path} is not a readable gnnpar model file ({type(e).__name__})."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UsageError(f"{path} is not a gnnpar model file (format {FORMAT} expected).")
    payload["path"] = str(path)
    return payload


def build_from(payload: dict[str, Any]) -> nn.Module:
    """The model described by a model file's dict, with its weights, in eval mode on CPU."""
    from gnnpar.models import build_model

    mcfg = ModelConfig(**payload["model"])
    model = build_model(mcfg, payload["in_dim"], payload["num_classes"], payload["multilabel"])
    model.load_state_dict(payload["state_dict"])
    return model.eval()


def load_model(run: str | os.PathLike) -> nn.Module:
    """``gnnpar.load(RUN_DIR)``: the run's final model, ready to call as ``model(x, edge_index)``."""
    return build_from(read_model_file(run))
