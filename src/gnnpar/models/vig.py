"""Vision GNN (Han et al., NeurIPS 2022) as study 000 uses it: pixels are nodes, 8 ViG blocks."""

from __future__ import annotations

from gnnpar.models.base import BlockModel


def build_vig(mcfg, in_dim: int, num_classes: int, multilabel: bool) -> BlockModel:
    raise NotImplementedError("vig is being written")  # replaced by the models work
