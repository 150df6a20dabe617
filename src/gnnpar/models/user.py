"""A user's own model: ``--model module:function``, ``--model pyg:NAME``, ``gnnpar.fit(model=...)``.

Three ways in, one kind of module out: an ``nn.Module`` called as ``model(x, edge_index)`` that
returns one row of logits per node (raw scores per class, or per label for multi-label data;
gnnpar applies the loss and the metric, so the model has no softmax of its own)::

    gnnpar train --dataset cora --model pyg:GIN --hidden 64 --layers 2
    gnnpar train --dataset cora --model pyg:GAT --model-args '{"v2": true}' --heads 4
    gnnpar train --dataset cora --model mymodels:build --model-args '{"hidden": 64}'

- ``module:function``: ``module`` is imported with the current folder first on ``sys.path``
  (as ``--dataset module:function`` is) and ``function(in_dim, num_classes, **model_args)`` is
  called on every rank, after the run's seed is set (so every rank starts from the same
  weights). A class is called with ``**model_args`` alone (``module:Class``, its own
  constructor). ``--model-args`` is a JSON object (or a TOML table, ``[model-args]``).
- ``pyg:NAME``: the class ``NAME`` of ``torch_geometric.nn.models`` (``GCN``, ``GraphSAGE``,
  ``GIN``, ``GAT``, ``EdgeCNN``, ``PNA``, or any other there). Its constructor's arguments are
  filled from the run: ``in_channels`` (the graph's features), ``out_channels`` (its classes),
  ``hidden_channels`` (``--hidden``; for ``GAT`` the total width, PyG divides it among the
  heads), ``num_layers`` (``--layers``), ``dropout`` (``--dropout``), ``heads`` (``--heads``,
  ``GAT`` only); ``PNA`` gets the in-degree histogram of the graph (``deg``) and PyG's example
  aggregators and scalers. Anything else, or a different value for any of these, comes from
  ``--model-args`` (``{"v2": true, "jk": "cat"}``); it wins over the flags.

What is checked, each with one message naming the model and exit status 2: the module can be
imported and the function or class found; calling it does not raise and returns an
``nn.Module``; the module has trainable parameters; and, once the graph is loaded, it maps the
graph's first nodes ``(x [n, in_dim], edge_index)`` to logits of shape ``[n, num_classes]``.

How it is rebuilt (``model.pt``, :mod:`gnnpar.result`): the **recipe** -- its ``target``
(``pyg:NAME``, ``module:function`` or ``module:Class``), how it is called (``"factory"``:
``target(in_dim, num_classes, **kwargs)``; ``"class"``: ``target(**kwargs)``) and the
``kwargs`` (plain values; PNA's ``deg`` as a list of counts) -- beside the module's own state
dict (the user's layout, not gnnpar's blocks). ``gnnpar.load`` and ``gnnpar predict`` import
the target again, call it, and load the weights with ``weights_only=True``; a target that can no
longer be imported is exit 2 naming it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

import torch
from torch import nn

from gnnpar.config.schema import ModelConfig
from gnnpar.errors import UsageError
from gnnpar.models.presets import USER_MODEL_FORMS
from gnnpar.targets import TARGET, brief, cwd_on_path, describe, import_target_module

PYG_MODELS = "torch_geometric.nn.models"
PYG_STACKS = ("GCN", "GraphSAGE", "GIN", "GAT", "EdgeCNN", "PNA")  # BasicGNN: the usual ones
# PNA's arguments besides the degrees, when --model-args does not give them (PyG's example)
PNA_DEFAULTS = {
    "aggregators": ["mean", "min", "max", "std"],
    "scalers": ["identity", "amplification", "attenuation"],
}
CHECK_NODES = 64  # the output-shape check runs the model on the subgraph of this many nodes


# ------------------------------------------------------------------------- finding the model
def resolve_target(name: str) -> Any:
    """The class or function ``name`` denotes (``pyg:NAME`` or ``module:function``); imports
    its module. UsageError naming the model for anything that cannot be found."""
    if name.startswith("pyg:"):
        return pyg_class(name[4:])
    if not TARGET.match(name):
        raise UsageError(f"--model {name}: give {USER_MODEL_FORMS}.")
    module_name, attr = name.split(":")
    with cwd_on_path():
        module = import_target_module("--model", name, module_name)
    obj = getattr(module, attr, None)
    if not callable(obj):
        raise UsageError(
            f"--model {name}: module {module_name} has no function or class {attr} "
            f"({getattr(module, '__file__', '')})."
        )
    return obj


def pyg_class(name: str) -> type[nn.Module]:
    models = importlib.import_module(PYG_MODELS)
    cls = getattr(models, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
        raise UsageError(
            f"Unknown --model pyg:{name}: {PYG_MODELS} has no model {name!r}. Node classifiers "
            f"there include {', '.join(PYG_STACKS)} (names are case-sensitive)."
        )
    return cls


# ------------------------------------------------------------------------------ the recipe
def recipe(mcfg: ModelConfig, in_dim: int, num_classes: int, graph: Any = None) -> dict[str, Any]:
    """How the run's model is built: ``{"target", "call", "kwargs"}`` (plain values only, so it
    goes into model.pt as it is). ``graph`` (a PyG Data): PNA's degree histogram is read from it."""
    name = mcfg.name
    if name.startswith("pyg:"):
        cls = pyg_class(name[4:])
        return {
            "target": name,
            "call": "class",
            "kwargs": pyg_kwargs(cls, mcfg, in_dim, num_classes, graph),
        }
    obj = resolve_target(name)
    call = "class" if inspect.isclass(obj) else "factory"
    return {"target": name, "call": call, "kwargs": dict(mcfg.args)}


def pyg_kwargs(
    cls: type, mcfg: ModelConfig, in_dim: int, num_classes: int, graph: Any = None
) -> dict[str, Any]:
    """The arguments of PyG's model ``cls`` for this run (see the module docstring)."""
    name = cls.__name__
    params = inspect.signature(cls.__init__).parameters
    run = {
        "in_channels": in_dim,
        "hidden_channels": mcfg.hidden,
        "num_layers": mcfg.layers,
        "out_channels": num_classes,
        "dropout": mcfg.dropout,
    }
    kwargs = {k: v for k, v in run.items() if k in params}
    if name == "GAT":
        kwargs["heads"] = mcfg.heads  # GAT passes it on to its convolutions (**kwargs)
    if name == "PNA":
        kwargs.update({k: v for k, v in PNA_DEFAULTS.items() if k not in mcfg.args})
        if "deg" not in mcfg.args:
            if graph is None:
                raise UsageError(
                    "--model pyg:PNA needs the graph's degree histogram; give it as "
                    "--model-args '{\"deg\": [...]}' (counts of nodes per in-degree)."
                )
            kwargs["deg"] = degree_histogram(graph.edge_index, int(graph.num_nodes))
    kwargs.update(mcfg.args)
    missing = [
        p.name
        for p in params.values()
        if p.name != "self"
        and p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in kwargs
    ]
    if missing:
        raise UsageError(
            f"--model pyg:{name} needs {', '.join(missing)}, which gnnpar does not fill in: "
            f"give {'them' if len(missing) > 1 else 'it'} in --model-args "
            f"(e.g. '{{\"{missing[0]}\": ...}}')."
        )
    return kwargs


def degree_histogram(edge_index: torch.Tensor, num_nodes: int) -> list[int]:
    """Nodes per in-degree (PNA's ``deg``; as ``PNAConv.get_degree_histogram`` counts them)."""
    deg = torch.bincount(edge_index[1], minlength=num_nodes)
    return torch.bincount(deg).tolist()


# ------------------------------------------------------------------------------- building
def make(rec: dict[str, Any], in_dim: int, num_classes: int) -> nn.Module:
    """Call the recipe's target; UsageError (naming the model) if it raises or returns no module."""
    name = rec["target"]
    obj = resolve_target(name)
    kwargs = dict(rec["kwargs"])
    if name == "pyg:PNA" and isinstance(kwargs.get("deg"), list):
        kwargs["deg"] = torch.tensor(kwargs["deg"], dtype=torch.long)
    what = getattr(obj, "__name__", name)
    refuse_unsafe(name, obj, rec["call"])
    try:
        with cwd_on_path():  # a factory that imports more of the user's modules
            if rec["call"] == "class":
                module = obj(**kwargs)
            else:
                module = obj(in_dim, num_classes, **kwargs)
    except UsageError:
        raise
    except Exception as e:
        args = "**model_args" if rec["call"] == "class" else "in_dim, num_classes, **model_args"
        raise UsageError(f"--model {name}: {what}({args}) raised {brief(e)}.") from None
    if not isinstance(module, nn.Module):
        raise UsageError(
            f"--model {name}: {what}() returned {describe(module)}, not a torch.nn.Module. A model "
            "factory returns the model: f(in_dim, num_classes, **model_args) -> nn.Module."
        )
    return module


def refuse_unsafe(name: str, obj: Any, call: str) -> None:
    """A recipe (from a model file, which anyone may have edited) calls only model code: a
    class must be an nn.Module, and no function of Python's standard library or of torch
    itself is a model factory (``shutil:rmtree`` must not be called by loading a file)."""
    top = name.split(":")[0].split(".")[0]
    is_module_class = inspect.isclass(obj) and issubclass(obj, nn.Module)
    if call == "class" and not is_module_class:
        raise UsageError(f"--model {name}: {name} is not a torch.nn.Module class.")
    if call != "class" and (top in sys.stdlib_module_names or top in ("torch", "builtins")):
        raise UsageError(
            f"--model {name}: a function of {top} is no model factory; give your own "
            "function f(in_dim, num_classes, **model_args) -> nn.Module."
        )


def build_user_model(
    mcfg: ModelConfig, in_dim: int, num_classes: int, graph: Any = None, check: bool = True
) -> nn.Module:
    """The user's module for this run, checked (``check``: trainable parameters, and with
    ``graph`` the output shape on its first nodes); with ``mcfg.weights`` (``gnnpar.fit`` given
    an instance) it starts from those weights."""
    module = make(recipe(mcfg, in_dim, num_classes, graph), in_dim, num_classes)
    if mcfg.weights:
        load_weights(module, mcfg.weights, mcfg.name)
    if check:
        check_module(module, mcfg.name, in_dim, num_classes, graph)
    return module


def load_weights(module: nn.Module, path: str, name: str) -> None:
    from gnnpar.data import safe_load

    if not os.path.isfile(path):
        raise UsageError(
            f"--model {name}: its starting weights {path} (written by gnnpar.fit for the "
            "instance it was given) are gone; run gnnpar.fit with the instance again."
        )
    try:
        state = safe_load.torch_load(path)
        module.load_state_dict(state)
    except Exception as e:
        raise UsageError(
            f"--model {name}: its starting weights ({path}) do not fit the rebuilt model "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})."
        ) from None


def check_module(
    module: nn.Module, name: str, in_dim: int, num_classes: int, graph: Any = None
) -> None:
    """Trainable parameters, and logits ``[n, num_classes]`` for the graph's first nodes."""
    if not any(p.requires_grad for p in module.parameters()):
        raise UsageError(
            f"--model {name}: the model has no trainable parameters (none with "
            "requires_grad), so training could not change it."
        )
    if graph is None:
        return
    x, edge_index = first_nodes(graph, CHECK_NODES)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = module(x, edge_index)
    except Exception as e:
        raise UsageError(
            f"--model {name}: calling it as model(x, edge_index) on the graph's first "
            f"{x.size(0)} nodes (x [{x.size(0)}, {in_dim}]) raised {brief(e)}."
        ) from None
    finally:
        module.train(was_training)
    expected = [x.size(0), num_classes]
    if not isinstance(out, torch.Tensor) or list(out.shape) != expected:
        got = describe(out)
        raise UsageError(
            f"--model {name}: model(x, edge_index) must return logits of shape "
            f"{expected} (one row per node, one column per class), got {got}."
        )


def first_nodes(graph: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x and edge_index of the subgraph induced by the first ``n`` nodes."""
    n = min(n, int(graph.num_nodes))
    ei = graph.edge_index
    keep = (ei[0] < n) & (ei[1] < n)
    return graph.x[:n].float(), ei[:, keep]


def rebuild(payload: dict[str, Any]) -> nn.Module:
    """The user's module of a model file (its recipe and state dict), weights loaded."""
    rec = payload["user_model"]
    module = make(rec, payload["in_dim"], payload["num_classes"])
    module.load_state_dict(payload["state_dict"])
    return module


def user_module(model: nn.Module) -> nn.Module:
    """The user's own module inside gnnpar's wrapper (adapt.to_block_model), else ``model``."""
    return getattr(model, "user_module", model)
