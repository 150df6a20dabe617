"""The five models of the studies, each a :class:`BlockModel` that a pipeline can cut.

``build_model(cfg.model, in_dim, num_classes, multilabel)`` returns ``stem -> blocks -> head``;
every block maps ``(x, edge_index) -> x`` (image models ignore ``edge_index``), so stage ``i`` of a
pipeline is ``blocks[a:b]`` with the stem on the first stage and the head (readout) on the last.
"""

from __future__ import annotations

from gnnpar.config import ModelConfig
from gnnpar.models.base import BlockModel
from gnnpar.models.gat import build_gat, build_gat3
from gnnpar.models.gcn import build_gcn
from gnnpar.models.sage import build_sage
from gnnpar.models.vig import build_vig

MODELS = {
    "gcn": build_gcn,
    "gat": build_gat,
    "gat3": build_gat3,
    "sage": build_sage,
    "vig": build_vig,
}


def build_model(
    mcfg: ModelConfig, in_dim: int, num_classes: int, multilabel: bool = False
) -> BlockModel:
    """The model named ``mcfg.name``, sized by the resolved config (see config.resolve)."""
    return MODELS[mcfg.name](mcfg, in_dim, num_classes, multilabel)


__all__ = ["BlockModel", "MODELS", "build_model"]
