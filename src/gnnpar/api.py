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

Your own model (:mod:`gnnpar.models.user`), three ways::

    run = gnnpar.fit("cora", model="pyg:GIN", hidden=64, layers=2)     # PyG's, by name
    run = gnnpar.fit("cora", model=build, model_args={"hidden": 64})   # a factory
    run = gnnpar.fit("cora", model=GIN(1433, 64, 2, 7), strategy="allreduce", workers=2, ...)

- a **factory** ``build(in_dim, num_classes, **model_args) -> nn.Module`` is passed on by name
  (``module:function``) and called on every rank; it must be a module-level function of a
  module the ranks can import (not one defined in ``__main__`` when ``workers > 1``).
- an **instance** is trained from the weights it has. The ranks are separate processes, and
  what reaches them is read with ``weights_only=True``, so the instance crosses as its class
  (``module:Class``, importable), the constructor arguments it was built with, and its state
  dict (``<data-root>/inputs/model-<sha>.pt``). gnnpar reads those arguments back from the
  instance's attributes named like its constructor's parameters (PyG's models keep
  ``in_channels``, ``hidden_channels``, ``num_layers``, ...; a GAT's ``v2`` and ``heads`` are
  read from its first convolution), rebuilds the class with them, and checks that the rebuilt
  module has the same structure (every submodule's name, class and ``extra_repr``, every
  tensor's shape; a plain function kept as an attribute is not seen); where it does not, ``fit``
  says so (exit 2 from the command line, ``UsageError`` here) and asks for a factory or
  ``pyg:NAME``. After the run the trained weights are loaded into the instance itself, which
  is what ``FitResult.model`` is. ``gnnpar.load`` of the run needs the class importable.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gnnpar.config.parse import default_data_root
from gnnpar.configure import build_config
from gnnpar.errors import UsageError
from gnnpar.result import atomic_save, load_model


@dataclass
class FitResult:
    model: nn.Module  # the final model, eval mode, CPU: model(x, edge_index) -> logits
    result: dict[str, Any]  # result.json
    out: Path  # the run's folder (result.json, model.pt, metrics.jsonl)


def fit(
    data: Any,
    model: str | nn.Module | Callable[..., nn.Module] = "gcn",
    strategy: str = "sequential",
    workers: int = 1,
    config: str | None = None,
    **flags: Any,
) -> FitResult:
    """Train on ``data`` (a PyG ``Data``, a dataset name, a ``.pt`` path, an OGB folder or
    ``"module:function"``) and return the trained model with its results. ``model``: a name
    (``"gcn"``, ``"pyg:GIN"``, ``"module:function"``), a factory, or an ``nn.Module`` instance
    (see the module docstring)."""
    from gnnpar.run import discard_unused_out, run

    data_root = flags.get("data_root") or flags.get("data-root")
    if not isinstance(data, (str, Path)):
        data = _save_input(data, data_root)
    instance, weights = None, None
    if isinstance(model, nn.Module):
        instance = model
        if flags.get("model_args") is not None or flags.get("model-args") is not None:
            raise UsageError(
                "gnnpar.fit(model=<an nn.Module instance>) takes no model_args: the instance is "
                "built already. Pass a factory (model=build, model_args={...}) instead."
            )
        model, flags["model_args"] = instance_recipe(instance, workers)
        weights = _save_weights(instance, data_root)
    elif callable(model) and not isinstance(model, str):
        model = factory_name(model, workers)
    settings = {"dataset": str(data), "model": model, "strategy": strategy, "workers": workers}
    cfg = build_config(config, {**settings, **flags})
    cfg.model.weights = weights
    threads = torch.get_num_threads()
    done = False
    try:
        result = run(cfg)
        done = True
    finally:  # a run that failed leaves no output folder it made and wrote nothing into
        discard_unused_out(keep=done)
        torch.set_num_threads(threads)
    out = Path(cfg.run.out)
    trained = load_model(out)
    if instance is not None:  # the instance itself, trained
        instance.load_state_dict(trained.state_dict())
        trained = instance.eval()
    return FitResult(trained, result or {}, out)


def factory_name(fn: Callable[..., Any], workers: int) -> str:
    """``module:function`` of a model factory, which every rank imports by that name."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or not name.isidentifier():
        raise UsageError(
            f"gnnpar.fit(model={fn!r}): a model factory must be a function defined at the top "
            "level of a module (every rank imports it as module:function; a lambda, a "
            "functools.partial or a nested function cannot be). Pass model_args for its "
            "keyword arguments."
        )
    _check_main(module, f"{module}:{name}", workers)
    return f"{module}:{name}"


def _check_main(module: str, target: str, workers: int) -> None:
    if module == "__main__" and workers > 1:
        raise UsageError(
            f"gnnpar.fit: the model's {target} is defined in the script or notebook itself "
            "(__main__), which the ranks of a run with workers > 1 cannot import. Move it into "
            "a module file (mymodels.py) and import it from there."
        )


def instance_recipe(module: nn.Module, workers: int = 1) -> tuple[str, dict[str, Any]]:
    """(``module:Class``, constructor arguments) that rebuild ``module``'s structure, read from
    its attributes and checked by rebuilding it; UsageError where they cannot be recovered."""
    cls = type(module)
    target = f"{cls.__module__}:{cls.__qualname__}"
    what = f"gnnpar.fit(model=<a {cls.__qualname__}>)"
    hint = (
        "Pass a factory instead (model=build, a module-level function build(in_dim, "
        "num_classes, **model_args) returning the model, with model_args={...}), or for one "
        'of PyG\'s models its name (model="pyg:GAT", model_args={"v2": True}).'
    )
    if not cls.__qualname__.isidentifier():
        raise UsageError(f"{what}: its class is not defined at the top level of a module. {hint}")
    _check_main(cls.__module__, target, workers)
    kwargs, missing = _constructor_args(module)
    if missing:
        raise UsageError(
            f"{what}: gnnpar cannot tell which {', '.join(missing)} built it (the instance "
            f"keeps no attribute of that name), and the ranks rebuild it from its class and "
            f"constructor arguments. {hint}"
        )
    try:
        kwargs = json.loads(json.dumps(kwargs))
        with torch.random.fork_rng(devices=[]):
            rebuilt = cls(**kwargs)
    except Exception as e:
        raise UsageError(
            f"{what}: rebuilding it as {cls.__qualname__}(**{kwargs}) failed "
            f"({type(e).__name__}). {hint}"
        ) from None
    if _structure(rebuilt) != _structure(module):
        raise UsageError(
            f"{what}: {cls.__qualname__}(**{kwargs}), built from the instance's attributes, "
            f"is not the same model (its structure or parameter shapes differ). {hint}"
        )
    return target, kwargs


def _structure(module: nn.Module) -> list[tuple]:
    """Every submodule's name, class and settings (extra_repr), and every tensor's shape."""
    modules = [(n, type(m).__qualname__, m.extra_repr()) for n, m in module.named_modules()]
    return modules + [(k, tuple(v.shape)) for k, v in module.state_dict().items()]


PLAIN = (int, float, str, bool, type(None))
ATTRIBUTE_OF = {"jk": "jk_mode"}  # PyG's BasicGNN keeps jk as jk_mode


def _constructor_args(module: nn.Module) -> tuple[dict[str, Any], list[str]]:
    """The constructor arguments the instance keeps as attributes of the same name (and the
    required ones it does not keep). Arguments with defaults that it does not keep are left at
    their defaults (the rebuild check catches one that was not)."""
    kwargs: dict[str, Any] = {}
    missing: list[str] = []
    params = inspect.signature(type(module).__init__).parameters
    for p in list(params.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        value = getattr(module, ATTRIBUTE_OF.get(p.name, p.name), inspect.Parameter.empty)
        if isinstance(value, nn.Dropout):
            value = value.p
        if _plain(value):
            kwargs[p.name] = value
        elif p.default is inspect.Parameter.empty:
            missing.append(p.name)
    kwargs.update(_pyg_conv_args(module))
    return kwargs, missing


def _plain(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    return isinstance(v, PLAIN)


def _pyg_conv_args(module: nn.Module) -> dict[str, Any]:
    """What PyG's GAT passes on to its convolutions (**kwargs), read from the first of them."""
    from torch_geometric.nn import GATv2Conv
    from torch_geometric.nn.models import GAT

    if not isinstance(module, GAT) or not len(module.convs):
        return {}
    conv = module.convs[0]
    return {"v2": isinstance(conv, GATv2Conv), "heads": int(conv.heads)}


def _save_weights(module: nn.Module, data_root: str | None) -> str:
    """The instance's weights as a file the ranks read with weights_only=True."""
    state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    buf = io.BytesIO()
    torch.save(state, buf)
    digest = hashlib.sha256(buf.getbuffer()).hexdigest()[:20]
    folder = Path(data_root or default_data_root()) / "inputs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"model-{digest}.pt"
    if not path.exists():
        atomic_save(state, path)
    return str(path)


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
