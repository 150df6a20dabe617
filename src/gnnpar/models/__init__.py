"""The five models of the studies, each a :class:`BlockModel` that a pipeline can cut.

``build_model(cfg.model, in_dim, num_classes, multilabel)`` returns ``stem -> blocks -> head``;
every block maps ``(x, edge_index) -> x`` (image models ignore ``edge_index``), so stage ``i`` of a
pipeline is ``blocks[a:b]`` with the stem on the first stage and the head (readout) on the last.

The builders are imported when a model is built, not when this package is: the study defaults
(:mod:`gnnpar.models.presets`) are read by :mod:`gnnpar.config`, which must not import torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gnnpar.config.schema import ModelConfig
    from gnnpar.models.base import BlockModel

# model name -> (module, builder function)
BUILDERS: dict[str, tuple[str, str]] = {
    "gcn": ("gnnpar.models.gcn", "build_gcn"),
    "gat": ("gnnpar.models.gat", "build_gat"),
    "gat3": ("gnnpar.models.gat", "build_gat3"),
    "sage": ("gnnpar.models.sage", "build_sage"),
    "vig": ("gnnpar.models.vig", "build_vig"),
}


def builder(name: str) -> Any:
    """The function that builds model ``name`` (imports its module, and so torch)."""
    module, function = BUILDERS[name]
    return getattr(import_module(module), function)


def build_model(
    mcfg: ModelConfig,
    in_dim: int,
    num_classes: int,
    multilabel: bool = False,
    graph: Any = None,
    check: bool = True,
) -> BlockModel:
    """The model named ``mcfg.name``, sized by the resolved config (see config.resolve).

    A user's model (``pyg:NAME``, ``module:function``; :mod:`gnnpar.models.user`) is built,
    checked (``check``; its output shape on ``graph``'s first nodes, where given; PNA reads its
    degrees from ``graph``) and wrapped into a BlockModel whose parameters are the module's own
    (:func:`gnnpar.models.adapt.to_block_model`); it returns raw logits (no head: the loss is
    cross-entropy, the same on logits as on log-softmax)."""
    if mcfg.name not in BUILDERS:
        from gnnpar.models.adapt import to_block_model
        from gnnpar.models.user import build_user_model

        module = build_user_model(mcfg, in_dim, num_classes, graph, check=check)
        return to_block_model(module, split_at=mcfg.split_at)
    return builder(mcfg.name)(mcfg, in_dim, num_classes, multilabel)


def __getattr__(name: str) -> Any:
    """``BlockModel`` and ``MODELS`` (name -> builder) load torch on first use only."""
    if name == "BlockModel":
        from gnnpar.models.base import BlockModel

        return BlockModel
    if name == "MODELS":
        return {n: builder(n) for n in BUILDERS}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BUILDERS", "BlockModel", "MODELS", "build_model", "builder"]
