"""Dataset registry: bundled Planetoid graphs, user-placed real datasets, synthetic generators.

Every dataset is a :class:`DatasetSpec` in :data:`REGISTRY` (one explicit dict). Loading returns a
:class:`GraphDataset` (a PyG ``Data`` with ``x, edge_index, y, train_mask, val_mask, test_mask``)
or an :class:`ImageDataset`. Missing files raise :class:`gnnpar.UsageError` naming the files,
the folder, and where to obtain them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch_geometric.data import Data

from gnnpar import UsageError

BUNDLED = Path(__file__).parent / "planetoid"


@dataclass
class GraphDataset:
    name: str
    data: Data  # x [N, F] float, edge_index [2, E] long, y [N] long or [N, C] float (multilabel)
    num_classes: int
    multilabel: bool = False

    @property
    def num_nodes(self) -> int:
        return int(self.data.num_nodes)

    @property
    def num_features(self) -> int:
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

    @property
    def num_features(self) -> int:
        return int(self.train_x.size(1))


Loaded = GraphDataset | ImageDataset


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    kind: str  # "graph" or "image"
    source: str  # "bundled", "user files", "generated"
    size: str  # human-readable size at scale 1
    files: tuple[str, ...]  # expected under data_root (bundled: inside the package)
    obtain: str  # where a user gets the files
    loader: Callable[[Path, float, int], Loaded]

    def folder(self, root: Path) -> Path:
        if self.source == "bundled":
            return BUNDLED
        return Path(root) / self.name

    def missing_files(self, root: Path) -> list[str]:
        if self.source == "generated":
            return []
        folder = self.folder(root)
        return [f for f in self.files if not (folder / f).exists()]

    def available(self, root: Path) -> bool:
        return self.source != "user files" or not self.missing_files(root)


def _require_files(spec: DatasetSpec, root: Path) -> Path:
    missing = spec.missing_files(root)
    if missing:
        folder = spec.folder(root)
        raise UsageError(
            f"Dataset '{spec.name}' is not available offline: missing {', '.join(missing)} in "
            f"{folder}. Obtain them from {spec.obtain} and place them in that folder "
            f"(or point --data-root / $GNNPAR_DATA at a folder holding '{spec.name}/')."
        )
    return spec.folder(root)


# ------------------------------------------------------------------------------------ Planetoid
PLANETOID_FILES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def _planetoid(name: str) -> Callable[[Path, float, int], Loaded]:
    def load(root: Path, scale: float, seed: int) -> Loaded:
        from torch_geometric.io import read_planetoid_data

        spec = REGISTRY[name.lower()]
        folder = _require_files(spec, root)
        raw = folder / f"{name}/raw" if spec.source == "bundled" else folder
        data = read_planetoid_data(str(raw), name.lower())
        # Row-normalise the bag-of-words features, as GAT and GCN do on these datasets.
        data.x = data.x / data.x.sum(dim=1, keepdim=True).clamp(min=1)
        return GraphDataset(name.lower(), data, int(data.y.max()) + 1)

    return load


def verify_bundled_checksums() -> list[str]:
    """Files whose SHA-256 differs from planetoid/SHA256SUMS (empty list: all good)."""
    bad = []
    for line in (BUNDLED / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split()
        if hashlib.sha256((BUNDLED / rel).read_bytes()).hexdigest() != digest:
            bad.append(rel)
    return bad


def _karate(root: Path, scale: float, seed: int) -> Loaded:
    from torch_geometric.datasets import KarateClub

    data = KarateClub()[0]
    n = data.num_nodes
    # KarateClub has 4 labelled training nodes; use the rest half for validation, half for test.
    rest = (~data.train_mask).nonzero().view(-1)
    perm = rest[torch.randperm(rest.numel(), generator=torch.Generator().manual_seed(seed))]
    data.val_mask = torch.zeros(n, dtype=torch.bool)
    data.test_mask = torch.zeros(n, dtype=torch.bool)
    data.val_mask[perm[: perm.numel() // 2]] = True
    data.test_mask[perm[perm.numel() // 2 :]] = True
    return GraphDataset("karate", data, int(data.y.max()) + 1)


def _planetoid_spec(name: str, source: str, size: str) -> DatasetSpec:
    lower = name.lower()
    files = tuple(
        f"{name}/raw/ind.{lower}.{s}" if source == "bundled" else f"ind.{lower}.{s}"
        for s in PLANETOID_FILES
    )
    return DatasetSpec(
        lower,
        "graph",
        source,
        size,
        files,
        "https://github.com/kimiyoung/planetoid (folder data/)",
        _planetoid(name),
    )


REGISTRY: dict[str, DatasetSpec] = {
    "cora": _planetoid_spec(
        "Cora", "bundled", "2,708 nodes, 10,556 edges, 1,433 features, 7 classes"
    ),
    "citeseer": _planetoid_spec(
        "CiteSeer", "bundled", "3,327 nodes, 9,104 edges, 3,703 features, 6 classes"
    ),
    "karate": DatasetSpec(
        "karate",
        "graph",
        "bundled",
        "34 nodes, 156 edges, 34 features, 4 classes",
        (),
        "built into PyG (torch_geometric.datasets.KarateClub)",
        _karate,
    ),
    "pubmed": _planetoid_spec(
        "PubMed", "user files", "19,717 nodes, 88,648 edges, 500 features, 3 classes"
    ),
}


def load_dataset(name: str, root: str | Path, scale: float = 1.0, seed: int = 0) -> Loaded:
    if name not in REGISTRY:
        raise UsageError(f"Unknown dataset '{name}'. Choose one of: {', '.join(REGISTRY)}.")
    spec = REGISTRY[name]
    return spec.loader(Path(root), scale, seed)
