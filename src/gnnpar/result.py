"""``<out>/model.pt``: the final model of a run, with everything needed to rebuild it.

The file is one ``torch.save``d dict of plain values and tensors (so :func:`load_model` reads it
with ``weights_only=True``, :mod:`gnnpar.data.safe_load`: loading a model file runs no code from it;
one naming any function or class is refused)::

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
from gnnpar.config.schema import ModelConfig
from gnnpar.data import safe_load

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
        payload = safe_load.torch_load(path)  # weights_only: tensors and plain values
    except safe_load.Refused as e:
        raise UsageError(
            f"{path} is not a gnnpar model file: {e.why()}, and gnnpar reads model files "
            "without running code from them. Use the model.pt a gnnpar run wrote."
        ) from None
    except Exception as e:  # zip/pickle/EOF errors of a damaged file
        raise UsageError(
            f"{path} is not a readable gnnpar model file ({type(e).__name__})."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UsageError(f"{path} is not a gnnpar model file (format {FORMAT} expected).")
    wrong = [key for key, kind in FIELDS.items() if not isinstance(payload.get(key), kind)]
    if wrong:
        raise UsageError(f"{path} is a damaged gnnpar model file (its {', '.join(wrong)}).")
    payload["path"] = str(path)
    return payload


FIELDS = {"state_dict": dict, "model": dict, "config": dict, "in_dim": int, "num_classes": int}


def build_from(payload: dict[str, Any]) -> nn.Module:
    """The model described by a model file's dict, with its weights, in eval mode on CPU."""
    from gnnpar.models import build_model

    try:
        mcfg = ModelConfig(**payload["model"])
        model = build_model(mcfg, payload["in_dim"], payload["num_classes"], payload["multilabel"])
        model.load_state_dict(payload["state_dict"])
    except UsageError:
        raise
    except Exception as e:  # settings or weights that do not fit together: not what gnnpar wrote
        where = payload.get("path", "the model file")
        raise UsageError(
            f"{where}: its model cannot be rebuilt ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''})."
        ) from None
    return model.eval()


def load_model(run: str | os.PathLike) -> nn.Module:
    """``gnnpar.load(RUN_DIR)``: the run's final model, ready to call as ``model(x, edge_index)``."""
    return build_from(read_model_file(run))
