"""The two kinds of dataset a run trains on: a graph, or images (ViG).

:class:`GraphDataset` is a PyG ``Data`` (``x, edge_index, y, train_mask, val_mask, test_mask``)
with its name and class count; :class:`ImageDataset` holds train/val/test images and labels.
Every loader (:mod:`gnnpar.data.datasets` for the named datasets, :mod:`gnnpar.data.user` for a
user's own graph) returns one of them.

"Is this an image dataset?" is asked one way: ``ds.kind == "image"`` (``"graph"`` otherwise;
before loading, by name: :func:`gnnpar.data.registry.kind_of`),
the same word :data:`gnnpar.data.registry.DATASETS` uses for a dataset known by name before it
is loaded.

No torch at import: the tensor types appear in annotations only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from torch_geometric.data import Data

GRAPH, IMAGE = "graph", "image"


@dataclass
class GraphDataset:
    name: str
    data: Data  # x [N, F] float32, edge_index [2, E] long, y [N] long or [N, C] uint8 (multilabel)
    num_classes: int
    multilabel: bool = False
    # What result.json and model.pt record about a user's graph (user.py): source, fingerprint,
    # directed, split, split_counts, num_nodes, num_edges. Empty for the registered datasets.
    info: dict[str, Any] = field(default_factory=dict)
    kind: ClassVar[str] = GRAPH

    @property
    def num_nodes(self) -> int:
        return int(self.data.num_nodes)

    @property
    def num_features(self) -> int:
        if "num_features" in self.info:  # a prepared graph's: its features may stay on disk
            return int(self.info["num_features"])
        return int(self.data.x.size(1))


@dataclass
class ImageDataset:
    name: str
    train_x: torch.Tensor  # [N, 3, 32, 32] float32, normalised per channel
    train_y: torch.Tensor  # [N] long
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int = 10
    multilabel: bool = False
    kind: ClassVar[str] = IMAGE

    @property
    def num_features(self) -> int:
        return int(self.train_x.size(1))

    def __repr__(self) -> str:
        sizes = ", ".join(
            f"{s}={getattr(self, f'{s}_x').size(0)}" for s in ("train", "val", "test")
        )
        return f"ImageDataset({self.name!r}, {sizes}, num_classes={self.num_classes})"


Loaded = GraphDataset | ImageDataset
